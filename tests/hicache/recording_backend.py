"""Our backend, logging every v2 call it answers, for the live hybrid test only.

Loaded by a live server through SGLang's ``dynamic`` backend (``test_live_hybrid.py``); the test
reads the lines back from the server log.
"""

from __future__ import annotations

import logging
from typing import Any

from mooncake_sgl.hicache.backend import MooncakeSglStorage

logger = logging.getLogger(__name__)
MARK = "recorded-v2"


class RecordingStorage(MooncakeSglStorage):
    def batch_get_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[Any, list[bool]]:
        return self._log_calls("get", transfers, super().batch_get_v2(transfers, extra_info))

    def batch_set_v2(self, transfers: list[Any], extra_info: Any = None) -> dict[Any, list[bool]]:
        return self._log_calls("set", transfers, super().batch_set_v2(transfers, extra_info))

    def _log_calls(self, op: str, transfers: list[Any], results: dict[Any, list[bool]]
                   ) -> dict[Any, list[bool]]:
        for t in transfers:
            found = "".join("1" if ok else "0" for ok in results[t.name])
            logger.warning("%s %s %s %s", MARK, op, t.name, found)
        return results
