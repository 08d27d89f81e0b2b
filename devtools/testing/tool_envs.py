"""Environment variables only the test and benchmark tools read. They are declared with the
product's registry type (``mooncake_sgl.envs.EnvVar``), so they parse and fail the same way, but
the product never reads them, so they are not in its registry."""

from __future__ import annotations

from mooncake_sgl.envs import EnvVar
from mooncake_sgl.units import parse_duration

MOONCAKE_SGL_STOP_GRACE = EnvVar("MOONCAKE_SGL_STOP_GRACE", 5.0, parse_duration,
                                 "how long a test server's stop waits before SIGKILL, e.g. 5s")
MOONCAKE_MASTER_BIN = EnvVar("MOONCAKE_MASTER_BIN", "", str, "path of the mooncake_master binary for tests")
