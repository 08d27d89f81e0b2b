"""The key namespace follows the weights a server runs when they change at run time.

Why: SGLang's weight updates (``/update_weights_from_disk``, ``_from_tensor``, ``_from_distributed``,
``_from_ipc``; every RL trainer that refreshes a serving engine calls one per step) flush the device
and host caches but never tell the storage backend. The checkpoint fingerprint taken at attach
(``fingerprint.py``) would go on naming the old weights' pages as this server's, and a prompt cached
before the update would be answered from KV the new weights never computed.

How: through SGLang's own plug-in hooks (``sglang.srt.plugins.hook_registry``), around
``SchedulerWeightUpdaterManager``'s update methods and after ``Scheduler.flush_cache``, in every
scheduler process (the targets, the condition and the cost are declared in
``touch_points.POINTS``; ``install_hook`` registers one of them):

1. When an update starts, every backend of this process stops serving: lookups and reads miss,
   writes are refused (``MooncakeSglStorage.weights_changing``). Nothing computed with either
   weights can be read or stored under a name that does not fit it.
2. When it returns, each backend is handed the new weights' identity (``next_weights``): a disk
   update's new checkpoint is fingerprinted like the one at attach (so servers loading the same
   checkpoint share pages again); any other update is the last checkpoint's fingerprint plus the
   ``weight_version`` the caller gave (servers told the same version share pages), or, with no
   version or a failed update, a random epoch that no other server will ever meet. The epoch is
   drawn once per server: TP rank 0's, broadcast to every rank (``shared_epoch``). MLA pages are
   written by rank 0 and read by every rank, and SGLang takes the least of the ranks' hits, so an
   epoch of each rank's own would make every storage hit after such an update a miss.
3. The backend takes the new namespace once SGLang's caches no longer hold KV of the old weights:
   at once if the update flushed them, else at the next successful ``/flush_cache``. Until then it
   keeps answering misses, which costs recomputation and never a wrong output.

The pages of the old weights stay in the tiers under their old namespace until the policies evict
them; they are never read by this server again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import uuid
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from .fingerprint import DIGEST_BYTES, Fingerprint, ModelSource, fingerprint
from .touch_points import Kind, TouchPoint, register_hook

logger = logging.getLogger(__name__)

UPDATE_PREFIX = "update_weights_from_"


@dataclasses.dataclass(frozen=True)
class WeightUpdate:
    """One weight update as SGLang was asked for it, and how it ended."""

    kind: str  # what follows ``update_weights_from_`` in the method's name: disk, tensor, ...
    model_path: str | None = None  # disk updates: the new checkpoint
    load_format: str | None = None
    version: str | None = None  # the caller's ``weight_version``
    succeeded: bool = False
    flushed: bool = False  # SGLang flushed its caches within the update
    epoch: str = ""  # a random token every rank of this server drew alike (``shared_epoch``)


class WeightFollower(Protocol):
    """What a storage backend does on a weight update (``MooncakeSglStorage``)."""

    def weights_changing(self) -> None: ...

    def weights_changed(self, update: WeightUpdate) -> None: ...

    def cache_flushed(self) -> None: ...


_followers: weakref.WeakSet[Any] = weakref.WeakSet()


def follow(backend: WeightFollower) -> None:
    """Have ``backend`` told of this process's weight updates (held weakly: a closed or dropped
    backend is forgotten)."""
    _followers.add(backend)


def source_after(update: WeightUpdate, source: ModelSource | None) -> ModelSource | None:
    """What SGLang loaded the weights from after ``update``: a new checkpoint for a disk update
    that succeeded, else ``None`` (the weights are no files of their own)."""
    if update.kind == "disk" and update.succeeded and update.model_path and source is not None:
        return dataclasses.replace(source, model_path=update.model_path,
                                   load_format=update.load_format or source.load_format)
    return None


def next_weights(update: WeightUpdate, base: Fingerprint, source: ModelSource | None) -> Fingerprint:
    """The identity of the weights after ``update``; ``base`` is the last checkpoint fingerprinted
    (at attach, or by a disk update) and ``source`` what SGLang loaded that one from."""
    loaded = source_after(update, source)
    if loaded is not None:
        return fingerprint(loaded)
    basis = (f"weight_version={update.version}" if update.succeeded and update.version
             else f"epoch={update.epoch or uuid.uuid4().hex}")
    digest = hashlib.blake2b(f"{base.digest}|{basis}".encode(), digest_size=DIGEST_BYTES).hexdigest()
    return Fingerprint(digest, f"{digest}: checkpoint {base.digest or '(none)'} after "
                               f"update_weights_from_{update.kind} ({basis})")


def shared_epoch() -> str:
    """A fresh random token, the same on every rank of this server: rank 0's, broadcast over
    SGLang's world group (its CPU group, as SGLang's scheduler broadcasts requests). Every rank's
    scheduler runs the update hook once per weight update, in the same order, so every rank calls
    this once per update. A process outside a distributed world keeps its own token; a broadcast
    that fails leaves each rank its own (with a warning): storage hits are lost, never wrong."""
    token = uuid.uuid4().hex
    try:
        from sglang.srt.runtime_context import get_parallel

        group = get_parallel().world_group
    except Exception:  # noqa: BLE001 - no distributed world in this process: one rank
        return token
    if group is None or group.world_size == 1:
        return token
    try:
        return str(group.broadcast_object(token, src=0))
    except Exception as e:  # noqa: BLE001 - SGLang's scheduler thread must not see it
        logger.warning("mooncake_sgl: the weight update's epoch could not be shared with the other "
                       "ranks (%s: %s); until the next update with a weight_version, pages one rank "
                       "writes are misses on the others", type(e).__name__, e)
        return token


def _each(call: Callable[[Any], None], what: str) -> None:
    # SGLang's scheduler thread runs these hooks: nothing of ours may raise into it.
    for backend in list(_followers):
        try:
            call(backend)
        except Exception:
            logger.exception("mooncake_sgl: %s failed for a storage backend", what)


def _around_update(kind: str) -> Callable[..., Any]:
    def hook(original: Callable[..., Any], manager: Any, recv_req: Any, *args: Any, **kwargs: Any) -> Any:
        _each(lambda b: b.weights_changing(), "a weight update's start")
        result = None
        try:
            result = original(manager, recv_req, *args, **kwargs)
            return result
        finally:
            # ``result`` is None when the update raised; the four request classes differ (only
            # the disk one has ``model_path``, the IPC one no ``load_format``), as do test doubles.
            succeeded = bool(getattr(result, "success", False))
            update = WeightUpdate(
                kind=kind, model_path=getattr(recv_req, "model_path", None),
                load_format=getattr(recv_req, "load_format", None),
                version=getattr(recv_req, "weight_version", None), succeeded=succeeded,
                flushed=succeeded and bool(getattr(recv_req, "flush_cache", False)),
                epoch=shared_epoch())
            _each(lambda b: b.weights_changed(update), "a weight update's end")
    return hook


def _after_flush(result: Any, *_: Any, **__: Any) -> None:
    if result is True:
        _each(lambda b: b.cache_flushed(), "a cache flush")


def install_hook(point: TouchPoint) -> bool:
    """Register the hook of ``point`` (an ``update_weights_from_*`` method: around it; ``flush_cache``:
    after it); True if registered now."""
    method = point.target.rsplit(".", 1)[1]
    if point.kind is Kind.HOOK_AROUND and method.startswith(UPDATE_PREFIX):
        return register_hook(point, _around_update(method.removeprefix(UPDATE_PREFIX)))
    if point.kind is Kind.HOOK_AFTER and method == "flush_cache":
        return register_hook(point, _after_flush)
    raise ValueError(f"no weight-update hook for {point.kind.value} on {point.target}")
