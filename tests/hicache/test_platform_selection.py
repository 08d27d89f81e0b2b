"""``SGLANG_PLATFORM`` naming another platform leaves ``--hicache-storage-backend mooncake`` ours.

SGLang's ``load_plugins()`` skips the general plug-ins of every distribution that offers a platform
other than the one ``SGLANG_PLATFORM`` selects (``_get_excluded_dists``). The wheel once declared a
``sglang.srt.platforms`` entry beside its storage plug-in, so an operator selecting an out-of-tree
platform silently got SGLang's built-in MooncakeStore under the name ``mooncake``. A fresh process
with a stub platform distribution installed and selected, the CPU distribution installed and its
switch on (as in this repository's venv), must still build our backend. Needs nothing of this
commit but ``sglang_state``: run against the parent commit, it fails there.
"""

from __future__ import annotations

from pathlib import Path

import mooncake_sgl

from . import sglang_state


def test_with_another_platform_selected_mooncake_is_still_our_backend(tmp_path: Path) -> None:
    env = {"SGLANG_PLATFORM": sglang_state.STUB_PLATFORM, "MOONCAKE_SGL_CPU_ADAPTATIONS": "1"}
    state = sglang_state.record(tmp_path, env, dists=("mooncake-sgl", "mooncake-sgl-cpu"), stub=True)
    assert state["mooncake_sgl"] == mooncake_sgl.__file__  # the child ran this checkout
    assert state["platform"] == "StubPlatform"  # the stub was the platform selected
    ours = ["mooncake_sgl.hicache.backend", "MooncakeSglStorage"]
    assert (state["registry_mooncake"], state["builds"]) == (ours, ".".join(ours))
