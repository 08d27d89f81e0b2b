"""Who else keys pages into the shared tiers, and whether their pages and ours can meet.

Instances share pages only when their key namespaces are equal (``keys.KeyNamespace``), and a
difference in one field — page size, layout, TP key grid, dtype, checkpoint, tag — makes two
instances on one pool silently never read each other's pages. A prefill and a decode configured
apart are the usual case: each instance alone looks healthy.

So every instance posts a short description of its namespace (no secrets: the tag appears only as
a digest) to each shared tier (``TierCapabilities.shared``: the pool, Mooncake Store), on a *board*
of ``SLOTS`` fixed-size records under well-known keys (``keys.board_key``), and reads the board
back. One record per distinct configuration, not per process: instances that would share pages
post the same identity and reuse its slot. A record is ``RECORD_BYTES`` of JSON padded with
spaces, so reading the board is one batch read of known sizes; a record that does not parse is
skipped. Records age out by being overwritten (the oldest first when the board is full), and a
self-evicting tier may drop them like any page: the board is a diagnostic, never a dependency.

This module touches tiers only through the ``Tier`` contract, never the store's policy or
residency: board records are not pages of any namespace.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from ..api import Tier
from ..config import MooncakeStoreTierConfig, PoolTierConfig
from ..keys import KeyNamespace, board_key

logger = logging.getLogger(__name__)

SLOTS = 64
RECORD_BYTES = 2048
FORMAT = 1
# A record this recent is not rewritten by its own identity's next attach (saves a write per
# instance start in a fleet); older ones are refreshed so ``seen`` stays meaningful.
REFRESH_AFTER_S = 600.0
# A record posted further ahead of this host's clock than any sane skew is not a record: it would
# never be the oldest (so never replaced on a full board) and never due for a refresh.
MAX_CLOCK_SKEW_S = 3600.0
ROLES = ("prefill", "decode", "colocated")
_PEER_ROLE = {"prefill": "decode", "decode": "prefill"}


@dataclass(frozen=True)
class NamespaceRecord:
    """One configuration's key namespace, as posted on the board."""

    role: str  # SGLang's disaggregation mode: prefill, decode, or colocated
    model: str
    weights: str  # checkpoint fingerprint ("" where not known)
    dtype: str
    layout: str
    page_size: int
    key_tp: str  # the TP grid keys are on: "*" for MLA (every rank shares), else tp_size x head split
    pp_size: int
    cp_size: int
    tag: str  # BLAKE2b of the namespace tag, "" without one (a tag may name a tenant)
    host: str = ""  # the latest poster of this identity
    seen: float = 0.0  # when it posted (Unix time)

    # What decides whether two instances' pages meet, with the words a person reads.
    MEET_FIELDS = (("model", "model"), ("weights", "checkpoint fingerprint"), ("dtype", "KV dtype"),
                   ("layout", "host layout"), ("page_size", "page size"), ("key_tp", "TP key grid"),
                   ("pp_size", "PP size"), ("cp_size", "CP size"), ("tag", "namespace tag"))

    def identity(self) -> tuple[Any, ...]:
        # By name, over this record's own fields: ``MEET_FIELDS`` is the one list of them.
        return (self.role, *(getattr(self, f) for f, _ in self.MEET_FIELDS))

    def differences(self, other: NamespaceRecord) -> list[str]:
        """Each field that keeps this instance's pages and ``other``'s apart, as 'name: here vs there'."""
        out = []
        for f, words in self.MEET_FIELDS:
            mine, theirs = getattr(self, f), getattr(other, f)
            if mine != theirs:
                out.append(f"{words} {_shown(f, mine)} here, {_shown(f, theirs)} there")
        return out

    def encode(self) -> bytes:
        raw = json.dumps({"format": FORMAT, **asdict(self)}, separators=(",", ":")).encode()
        if len(raw) > RECORD_BYTES:  # a model path of ~1.8 KB: keep its tail, which names it
            over = len(raw) - RECORD_BYTES
            return replace(self, model="..." + self.model[over + 3:]).encode()
        return raw.ljust(RECORD_BYTES, b" ")

    @classmethod
    def decode(cls, raw: bytes, now: float | None = None) -> NamespaceRecord | None:
        """The record in ``raw``, or ``None`` for anything else: a torn or foreign value, a field of
        the wrong type, a ``seen`` that is not a time up to ``MAX_CLOCK_SKEW_S`` past ``now``
        (default: the clock now). Any process that reaches a shared tier can write a slot, so
        nothing in ``raw`` may raise here: a nested value deep enough for ``RecursionError`` once
        made the whole board unreadable to every instance."""
        try:
            data = json.loads(raw.rstrip(b" \x00"))
            if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
                return None
            if set(data) != {f.name for f in fields(cls)}:
                return None
            record = cls(**data)
        except (ValueError, TypeError, RecursionError):
            return None
        latest = (time.time() if now is None else now) + MAX_CLOCK_SKEW_S
        ints = (record.page_size, record.pp_size, record.cp_size)
        ok = (record.role in ROLES and all(type(v) is int for v in ints)
              and type(record.seen) in (int, float) and 0 <= record.seen <= latest
              and all(isinstance(getattr(record, f), str) for f in ("model", "weights", "dtype", "layout",
                                                                    "key_tp", "tag", "host")))
        return record if ok else None


def _shown(field: str, value: Any) -> str:
    if field in ("weights", "tag"):
        return _printable(value[:12]) or "none"
    return _printable(str(value)) if value != "" else "none"


def _printable(text: str) -> str:
    """``text`` with control characters escaped: a record's strings come from whoever wrote the
    slot, and a newline in one would forge a line of this server's log."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def record_for(ns: KeyNamespace, head_split: int, role: str) -> NamespaceRecord:
    """This instance's record: ``ns`` is its KV namespace, ``head_split`` the head groups each page
    is stored as (1 without split heads)."""
    return NamespaceRecord(
        role=role, model=ns.model, weights=ns.weights, dtype=ns.dtype, layout=ns.layout,
        page_size=ns.page_size, key_tp="*" if ns.rank_replicated else str(ns.tp_size * head_split),
        pp_size=ns.pp_size, cp_size=ns.cp_size,
        tag=hashlib.blake2b(ns.tag.encode(), digest_size=8).hexdigest() if ns.tag else "",
        host=socket.gethostname(), seen=time.time())


def info_fields(record: NamespaceRecord, tier_configs: Sequence[Any]) -> dict[str, Any]:
    """``record`` and where it is shared, as the ``/metrics`` namespace series shows them
    (``metrics.model.NAMESPACE_LABELS``)."""
    return {**asdict(record), "shared": shared_places(tier_configs)}


def shared_places(tier_configs: Sequence[Any]) -> str:
    """Where the shared tiers among ``tier_configs`` live, one comparable string: instances whose
    strings overlap key into the same pool or master (``pool:HOST:PORT``, ``mooncake_store:MASTER``)."""
    places = []
    for c in tier_configs:
        if isinstance(c, PoolTierConfig):
            places += [f"pool:{e}" for e in c.endpoints]
        elif isinstance(c, MooncakeStoreTierConfig):
            places.append(f"mooncake_store:{c.master}")
    return ",".join(sorted(places))


def sglang_role() -> str:
    """This process's disaggregation mode in SGLang's terms (``colocated`` where SGLang says
    ``null``, or where it cannot be read: outside a scheduler, another SGLang release)."""
    try:
        from sglang.srt.runtime_context import get_disagg

        mode = str(get_disagg().disaggregation_mode)
    except Exception:  # noqa: BLE001 - SGLang's runtime context is not ours to validate
        return "colocated"
    return mode if mode in ROLES else "colocated"


def read_board(tier: Tier) -> list[tuple[int, NamespaceRecord | None]]:
    """(slot, record or ``None`` for an empty or unreadable slot) for every slot of ``tier``'s board."""
    keys = [board_key(s) for s in range(SLOTS)]
    bufs = [bytearray(RECORD_BYTES) for _ in keys]
    found = tier.get_into(keys, [[memoryview(b)] for b in bufs])
    return [(s, NamespaceRecord.decode(bytes(b)) if ok else None)
            for s, (ok, b) in enumerate(zip(found, bufs))]


def post(tier: Tier, record: NamespaceRecord) -> list[NamespaceRecord]:
    """Post ``record`` on ``tier``'s board and return every other identity's record found there.

    The slot: the one already holding this identity, else the first empty one from the identity's
    home slot, else the oldest record's. Raises what the tier raises when it is broken as a whole.
    """
    board = read_board(tier)
    others = [r for _, r in board if r is not None and r.identity() != record.identity()]
    mine = [(s, r) for s, r in board if r is not None and r.identity() == record.identity()]
    if mine and record.seen - mine[0][1].seen < REFRESH_AFTER_S:
        return others
    home = int.from_bytes(hashlib.blake2b(repr(record.identity()).encode(), digest_size=4).digest(), "big")
    if mine:
        slot = mine[0][0]
    else:
        empty = [s for s, r in board if r is None]
        if empty:
            slot = min(empty, key=lambda s: (s - home) % SLOTS)
        else:
            slot = min(board, key=lambda sr: sr[1].seen)[0]  # type: ignore[union-attr]
    key = board_key(slot)
    tier.remove([key])  # a put of a present key is a no-op: replace means remove first
    tier.put_from([key], [[memoryview(record.encode())]])
    return others


def announce(tiers: Sequence[Tier], record: NamespaceRecord) -> list[NamespaceRecord]:
    """Post ``record`` on the board of every shared tier among ``tiers``; every other identity
    found on any of them (deduplicated, newest first). A tier that fails is skipped with a
    warning: the board never fails an attach."""
    seen: dict[tuple[Any, ...], NamespaceRecord] = {}
    for tier in tiers:
        if not tier.capabilities.shared:
            continue
        try:
            found = post(tier, record)
        except Exception as e:  # noqa: BLE001 - a diagnostic must not take the backend down
            logger.warning("mooncake_sgl: namespace board on tier %s not reachable (%s: %s); instances "
                           "that cannot share pages with this one go unreported", tier.name,
                           type(e).__name__, e)
            continue
        for r in found:
            if r.identity() not in seen or seen[r.identity()].seen < r.seen:
                seen[r.identity()] = r
    return sorted(seen.values(), key=lambda r: -r.seen)


def peer_report(own: NamespaceRecord, others: Sequence[NamespaceRecord]) -> tuple[int, str] | None:
    """(log level, one line) on whether a prefill's pages meet the decodes' on the same tiers (or
    a decode's the prefills'); ``None`` when ``own`` is colocated or no peer role posted yet."""
    role = _PEER_ROLE.get(own.role)
    peers = [r for r in others if r.role == role]
    if role is None or not peers:
        return None
    meets = [r for r in peers if not own.differences(r)]
    if meets:
        return logging.INFO, (f"mooncake_sgl: this {own.role} shares pages with the {role} "
                              f"{_where(meets[0])} on the shared tiers")
    closest = min(peers, key=lambda r: len(own.differences(r)))
    return logging.WARNING, (f"mooncake_sgl: this {own.role} cannot share pages with the {role} "
                             f"{_where(closest)} on the shared tiers: "
                             + "; ".join(own.differences(closest))
                             + " (see docs/pd.md, configuration on each side)")


def _where(r: NamespaceRecord) -> str:
    ago = max(0.0, time.time() - r.seen)
    return f"on {_printable(r.host) or 'an unnamed host'} (posted {ago:.0f} s ago)"


class BoardCheck:
    """One backend's board duty: post its record at attach and after its namespace changes, and
    look once more at its first storage call when no peer role had posted yet (instances of a
    deployment attach at about the same time; by the first request they all have). Every read and write runs
    on a thread of its own: a slow or dead pool must not delay an attach or a storage call."""

    def __init__(self, tiers: Sequence[Tier]) -> None:
        self._tiers = [t for t in tiers if t.capabilities.shared]
        self._record: NamespaceRecord | None = None
        self._peer_seen = False
        self._looked_again = False

    def post(self, record: NamespaceRecord) -> None:
        self._record = record
        self._run(record)

    def in_use(self) -> None:
        if self._peer_seen or self._looked_again or self._record is None:
            return
        self._looked_again = True
        self._run(replace(self._record, seen=time.time()))

    def _run(self, record: NamespaceRecord) -> None:
        if self._tiers:
            threading.Thread(target=self._check, args=(record,), name="mooncake_sgl-board",
                             daemon=True).start()

    def _check(self, record: NamespaceRecord) -> None:
        report = peer_report(record, announce(self._tiers, record))
        if report is not None:
            self._peer_seen = True
            logger.log(*report)
