"""Prefill/decode disaggregation on a host without an accelerator: two CUDA assumptions of sglang
0.5.23's prefill send path and one race its two shared cores meet, each adapted under the same
switch and gates as ``adaptations``.

1. ``MooncakeKVSender.supports_host_tensor_indices`` is ``True`` (``disaggregation/mooncake/
   conn.py``), so the prefill copies a chunk's page indices into a pinned host tensor and records a
   CUDA event (``disaggregation/prefill.py``, ``send_kv_chunk``): the first request kills the
   prefill with ``Found no NVIDIA driver``. ``plain_page_indices`` sets it ``False``; the sender
   then takes sglang's own plain path (``kv_to_page_indices``), which it takes for every other
   transfer backend.
2. Under the overlap scheduler, the early send of a cached prefix records a ``torch.cuda.Event``
   on the forward stream (``maybe_send_cached_prefix_chunk``) so that the transfer waits for the
   previous forward's writes. On the CPU device that stream is a ``torch.cpu.Stream`` and the
   record raises; a repeated prompt kills the prefill. There is nothing to wait for either: on the
   CPU the forward has run to its end before the scheduler continues. ``early_send_without_event``
   runs that method as with the overlap off for the duration of the call, so the early send
   itself still happens, without the event.

3. The prefill's transfer worker asks ``room not in request_status or check_status(room) ...``
   while the scheduler thread's ``sender.clear()`` pops the room once it sees Success: a pop between
   the two reads raises ``KeyError`` inside the worker, the worker thread dies ("Prefill instance
   ... is dead"), and every later request of that prefill waits out the 300 s transfer timeout and
   fails. Every such question in ``mooncake/conn.py`` treats a room that is gone as concluded
   (skip its chunks, tear its bookkeeping down); ``room_gone_is_concluded`` makes ``check_status``
   answer ``Failed`` for a room that is gone, which is what each of those callers does when its
   ``not in`` test sees the room gone first (and what the same file's bootstrap thread already
   reads: ``request_status.get(room, KVPoll.Failed)``). The race is not the CPU's own, but two shared cores
   widen its window until a benchmark meets it (one prefill in five runs here); it stays under the
   CPU switch because this package does not change SGLang's transfer path on a GPU host.

None changes an output: (1) and (2) choose between two ways sglang itself has of doing the same
send, (3) gives the answer sglang gives a room it saw gone a moment earlier. (3) is SGLang's bug,
written up with a minimal reproduction for upstream in ``docs/sglang-touch-points.md``. Each is a
record of ``touch_points.POINTS``, whose ``target`` names what the function given it patches.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from mooncake_sgl.hicache.touch_points import TouchPoint, owner_of

logger = logging.getLogger(__name__)

_EARLY_SEND_MARK = "__mooncake_sgl_no_event__"
_ROOM_GONE_MARK = "__mooncake_sgl_room_gone__"


def plain_page_indices(point: TouchPoint) -> bool:
    """The Mooncake KV sender takes the plain page-index path. True if changed now."""
    try:
        sender, name = owner_of(point.target)
    except ImportError:  # no mooncake transfer backend here: nothing sends through it
        return False
    if getattr(sender, name) is False:
        return False
    setattr(sender, name, False)
    return True


def early_send_without_event(point: TouchPoint) -> bool:
    """The cached-prefix early send records no CUDA event. True if patched now."""
    try:
        mixin, name = owner_of(point.target)
    except ImportError:
        return False
    original = getattr(mixin, name)
    if getattr(original, _EARLY_SEND_MARK, False):
        return False
    setattr(mixin, name, _without_overlap(original))
    return True


def _without_overlap(original: Callable[..., None]) -> Callable[..., None]:
    @functools.wraps(original)
    def send(self: Any, *args: Any, **kwargs: Any) -> None:
        # The scheduler's loop is one thread: nothing else reads the flag during the call.
        overlap = self.enable_overlap
        self.enable_overlap = False
        try:
            return original(self, *args, **kwargs)
        finally:
            self.enable_overlap = overlap

    setattr(send, _EARLY_SEND_MARK, True)
    return send


def room_gone_is_concluded(point: TouchPoint) -> bool:
    """The Mooncake KV manager answers ``Failed`` for a room cleared under it. True if patched now."""
    try:
        from sglang.srt.disaggregation.base.conn import KVPoll

        manager, name = owner_of(point.target)
    except ImportError:
        return False
    if getattr(getattr(manager, name), _ROOM_GONE_MARK, False):
        return False

    def check_status(self: Any, bootstrap_room: int) -> Any:
        return self.request_status.get(bootstrap_room, KVPoll.Failed)

    setattr(check_status, _ROOM_GONE_MARK, True)
    setattr(manager, name, check_status)
    return True
