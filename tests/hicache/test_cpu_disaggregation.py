"""The prefill send path of prefill/decode disaggregation on a host without CUDA
(``mooncake_sgl_cpu.disaggregation``): each adaptation applied by the plug-in in this
process, and the sglang code it steers around shown to fail here."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from mooncake_sgl_cpu import disaggregation
from mooncake_sgl_cpu.touch_points import EARLY_SEND, PLAIN_PAGE_INDICES, ROOM_GONE

PAGE = 64


def test_the_mooncake_sender_takes_the_plain_page_index_path() -> None:
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    # The host-tensor path's first step is a pinned tensor: without a GPU driver it raises, and the
    # prefill's first request died of it.
    with pytest.raises(RuntimeError, match="(?i)nvidia|cuda"):
        torch.empty(4, dtype=torch.int64, pin_memory=True)
    assert MooncakeKVSender.supports_host_tensor_indices is False  # the plug-in ran in this process
    assert disaggregation.plain_page_indices(PLAIN_PAGE_INDICES) is False  # already so: nothing to do twice


def _prefill_scheduler(sent: list[int]) -> SimpleNamespace:
    """What ``maybe_send_cached_prefix_chunk`` reads of a scheduler: overlap on, a CPU stream."""
    return SimpleNamespace(
        enable_overlap=True, enable_staging=False, forward_stream=torch.get_device_module("cpu").Stream(),
        token_to_kv_pool_allocator=SimpleNamespace(page_size=PAGE),
        send_kv_chunk=lambda req, last_chunk=False, end_idx=None: sent.append(end_idx))


def _request() -> SimpleNamespace:
    return SimpleNamespace(pending_bootstrap=False, early_send_prefix_end=None, prefix_len=3 * PAGE,
                           host_hit_length=0, start_send_idx=0, disagg_kv_sender=SimpleNamespace())


def test_the_early_send_of_a_cached_prefix_records_no_cuda_event() -> None:
    from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin as Mixin

    patched = Mixin.maybe_send_cached_prefix_chunk
    assert getattr(patched, "__mooncake_sgl_no_event__", False)  # the plug-in ran in this process
    sent: list[int] = []
    with pytest.raises((RuntimeError, TypeError), match="stream"):  # what killed the prefill
        patched.__wrapped__(_prefill_scheduler(sent), _request())

    scheduler, req = _prefill_scheduler(sent), _request()
    patched(scheduler, req)
    assert sent == [3 * PAGE]  # the early send still happens, the whole cached prefix
    assert not hasattr(req.disagg_kv_sender, "_early_send_wait_event")
    assert scheduler.enable_overlap is True  # the scheduler's own setting is back after the call
    assert disaggregation.early_send_without_event(EARLY_SEND) is False  # not wrapped twice


def test_a_room_cleared_under_the_transfer_worker_reads_as_concluded() -> None:
    """The scheduler's ``sender.clear()`` pops a room between the transfer worker's ``room not in
    request_status`` and its ``check_status(room)``; sglang's own lookup raised there and the
    worker thread died, failing every later request of the prefill after a 300 s wait."""
    from sglang.srt.disaggregation.base.conn import KVPoll
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    room = 6808279646372867311

    class Cleared(dict):
        """A status table whose room is popped by the other thread right after ``in`` saw it."""

        def __contains__(self, key: object) -> bool:
            found = dict.__contains__(self, key)
            self.pop(key, None)
            return found

    def torn_down(check_status) -> bool:  # the worker's teardown test (mooncake/conn.py, ~2855)
        manager = SimpleNamespace(request_status=Cleared({room: KVPoll.Success}))
        return (room not in manager.request_status
                or check_status(manager, room) == KVPoll.Success
                or check_status(manager, room) == KVPoll.Failed)

    with pytest.raises(KeyError):  # what killed the worker thread
        torn_down(CommonKVManager.check_status)
    assert torn_down(MooncakeKVManager.check_status)  # the plug-in ran in this process
    live = SimpleNamespace(request_status={room: KVPoll.Transferring})
    assert MooncakeKVManager.check_status(live, room) == KVPoll.Transferring  # a live room as before
    assert disaggregation.room_gone_is_concluded(ROOM_GONE) is False  # not patched twice
