"""The pool's wire format: a fixed binary header, a msgpack control message, raw page bytes.

Every frame is::

    header (24 bytes, little endian)   magic "MSGP" | version u8 | op u8 | flags u16 |
                                       request id u32 | meta length u32 | data length u64
    meta   (meta length bytes)         one msgspec-msgpack struct per op (never pickle)
    data   (data length bytes)         page bytes back to back, in the order of the meta's keys

A batch is one frame each way: a PUT carries every page of the batch, a GET reply every found page.
The one-sided transports (shared memory, RDMA) move no data in frames; their RESERVE/COMMIT and
LEASE/RELEASE pairs carry segment offsets, and the client moves the bytes itself.

Connection start (the server speaks first)::

    server -> SERVER_HELLO {version, server id, nonce, unix socket name, rdma, limits}
    client -> CLIENT_HELLO {HMAC-SHA256(tenant secret, nonce | tenant), want shared memory, tenant}
    server -> HELLO_OK {segment size}  (+ the tenant's segment memfd over SCM_RIGHTS on a Unix socket)
           or ERROR {kind "auth"} and the connection closes before any page moves.

Until HELLO_OK the server accepts only a CLIENT_HELLO of at most ``HANDSHAKE_MAX_META`` bytes, and
the whole handshake has one deadline: an unauthenticated peer can make it allocate or wait for
nothing more.

Any frame with a wrong magic, an unknown version, or a length past the limits gets an ERROR frame
naming the problem and the connection closes (the stream cannot be resynchronised).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import struct

import msgspec

from ..errors import AuthError, ProtocolError

PROTOCOL_VERSION = 1
MAGIC = b"MSGP"
HEADER = struct.Struct("<4sBBHIIQ")
HEADER_SIZE = HEADER.size

# Defaults; the server's config can lower or raise them and announces them in SERVER_HELLO.
DEFAULT_MAX_META_BYTES = 16 << 20  # a 4096-key batch of 100-byte keys is ~0.5 MiB; arbitrary headroom
DEFAULT_MAX_DATA_BYTES = 2 << 30  # 128 pages of 8 MiB is 1 GiB; twice that, arbitrary
DEFAULT_MAX_BATCH = 4096
# The largest CLIENT_HELLO or SERVER_HELLO: a MAC or nonce plus a few short names. Arbitrary,
# with headroom; neither side allocates more for a peer it has not authenticated.
HANDSHAKE_MAX_META = 4096
# The longest page key. SGLang's are about 100 bytes (a 64-hex hash plus model and rank tags);
# the pool keeps every key in its index, so an unbounded one would be memory outside capacity.
MAX_KEY_BYTES = 1024

# Frame flags.
FLAG_NO_REPLY = 1  # one-way message (RELEASE): the server sends nothing back


class Op(enum.IntEnum):
    SERVER_HELLO = 1
    CLIENT_HELLO = 2
    HELLO_OK = 3
    ERROR = 4
    PUT = 10  # two-sided: pages in the frame
    GET = 11  # two-sided: pages in the reply
    EXISTS = 12
    REMOVE = 13
    STATS = 14
    CLEAR = 15
    RESERVE = 20  # one-sided put, phase 1: slots for the pages
    COMMIT = 21  # one-sided put, phase 2: make the written pages readable
    LEASE = 22  # one-sided get: offsets, pages pinned until RELEASE
    RELEASE = 23
    RDMA_CONNECT = 30


REPLY_BIT = 0x80  # a reply's op is the request's op | REPLY_BIT


# ------------------------------------------------------------------------------------ messages

class _Msg(msgspec.Struct, frozen=True, array_like=True):
    """Base: encoded as a msgpack array (positional), so field names never travel."""


class ServerHello(_Msg):
    version: int
    server_id: str
    nonce: bytes
    unix_name: str  # abstract Unix socket for same-host clients; "" when disabled
    auth_required: bool
    rdma: bool
    max_meta: int
    max_data: int
    max_batch: int


class ClientHello(_Msg):
    mac: bytes  # HMAC-SHA256(secret, nonce | tenant); empty when the client has no secret
    want_shm: bool = False
    client: str = ""
    tenant: str = ""  # "" = the server's single, default tenant


class HelloOk(_Msg):
    segment_size: int
    shm: bool  # the segment's file descriptor follows as SCM_RIGHTS ancillary data
    # A reservation or lease older than this (seconds) is void: the server frees it, so a stalled
    # client cannot pin pages; the client stops copying before it gets that old.
    hold_timeout: float = 30.0
    # Most bytes one client process may hold reserved or leased at once; past it pages are not
    # stored / not found. The client keeps each one-sided batch to half of it.
    max_hold_bytes: int = 1 << 62
    # The server closes a connection idle this long (seconds); the client retires its idle
    # connections well before, so a request never races the server's close.
    idle_timeout: float = 600.0


class ErrorMsg(_Msg):
    kind: str  # "protocol", "auth", "version", "limit", "internal"
    message: str


class Keys(_Msg):
    """EXISTS, REMOVE."""
    keys: list[bytes]


class KeysSizes(_Msg):
    """PUT, GET, RESERVE, LEASE: the pages' keys and sizes (for GET/LEASE, the expected sizes)."""
    keys: list[bytes]
    sizes: list[int]


class Flags(_Msg):
    """Per-key results, one byte per key (0 = False, 1 = True). A PUT's reply may also say
    ``PUT_PRESENT``: the page was already stored and nothing was written (true to a client that
    reads the byte as a bool, so older clients see what they always did)."""
    flags: bytes


PUT_PRESENT = 2


class Count(_Msg):
    n: int


class Empty(_Msg):
    pass


class GetReply(_Msg):
    """Size of each page that follows in the data part; -1 for a miss (absent or size differs)."""
    sizes: list[int]


class Reservation(_Msg):
    """RESERVE reply. ``status`` per key: WRITE (slot at ``offsets[i]``), PRESENT, or NO_ROOM."""
    ticket: int
    status: bytes
    offsets: list[int]


class CommitReq(_Msg):
    ticket: int
    written: bytes  # per key of the reservation: 1 if the client wrote the slot completely


class Lease(_Msg):
    """LEASE reply: pinned pages at ``offsets`` (``sizes[i] == -1`` for a miss)."""
    lease: int
    offsets: list[int]
    sizes: list[int]


class ReleaseReq(_Msg):
    lease: int


class Stats(_Msg):
    stats: dict[str, float]


class RdmaEndpoint(_Msg):
    """One side's queue pair, for RTR/RTS; the server adds its segment's address and rkey."""
    qp_num: int
    lid: int
    gid: bytes
    psn: int
    mtu: int
    addr: int = 0
    rkey: int = 0


RESERVE_WRITE = 0
RESERVE_PRESENT = 1
RESERVE_NO_ROOM = 2

_REQUEST_TYPES: dict[Op, type] = {
    Op.CLIENT_HELLO: ClientHello, Op.PUT: KeysSizes, Op.GET: KeysSizes, Op.EXISTS: Keys,
    Op.REMOVE: Keys, Op.STATS: Empty, Op.CLEAR: Empty, Op.RESERVE: KeysSizes, Op.COMMIT: CommitReq,
    Op.LEASE: KeysSizes, Op.RELEASE: ReleaseReq, Op.RDMA_CONNECT: RdmaEndpoint,
}
_decoders = {t: msgspec.msgpack.Decoder(t) for t in set(_REQUEST_TYPES.values()) | {
    ServerHello, HelloOk, ErrorMsg, Flags, Count, GetReply, Reservation, Lease, Stats}}
_encoder = msgspec.msgpack.Encoder()


def request_type(op: int) -> type:
    try:
        return _REQUEST_TYPES[Op(op)]
    except (ValueError, KeyError):
        raise ProtocolError(f"unknown request op {op}") from None


def encode(msg: msgspec.Struct) -> bytes:
    return _encoder.encode(msg)


def decode(data: bytes | memoryview, cls: type) -> msgspec.Struct:
    try:
        return _decoders[cls].decode(data)
    except msgspec.DecodeError as e:
        raise ProtocolError(f"malformed {cls.__name__} message: {e}") from None


def pack_header(op: int, meta_len: int, data_len: int = 0, *, req_id: int = 0, flags: int = 0,
                version: int = PROTOCOL_VERSION) -> bytes:
    return HEADER.pack(MAGIC, version, op, flags, req_id, meta_len, data_len)


def frame(op: int, msg: msgspec.Struct, data_len: int = 0, *, req_id: int = 0, flags: int = 0) -> bytes:
    """Header plus meta of a frame; the caller sends ``data_len`` bytes of data after it."""
    meta = encode(msg)
    return pack_header(op, len(meta), data_len, req_id=req_id, flags=flags) + meta


class Header(msgspec.Struct, frozen=True):
    version: int
    op: int
    flags: int
    req_id: int
    meta_len: int
    data_len: int


def parse_header(raw: bytes | memoryview, *, max_meta: int, max_data: int) -> Header:
    """Check magic, version and limits; ``ProtocolError`` names what is wrong."""
    magic, version, op, flags, req_id, meta_len, data_len = HEADER.unpack(raw)
    if magic != MAGIC:
        raise ProtocolError(f"bad frame magic {bytes(magic)!r} (expected {MAGIC!r}): "
                            "not a mooncake-sgl pool peer")
    if version != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {version}; this side speaks "
                            f"version {PROTOCOL_VERSION}")
    if meta_len > max_meta:
        raise ProtocolError(f"frame control part of {meta_len} bytes exceeds the limit of "
                            f"{max_meta} bytes (max_meta_bytes)")
    if data_len > max_data:
        raise ProtocolError(f"frame data part of {data_len} bytes exceeds the limit of "
                            f"{max_data} bytes (max_frame_bytes)")
    return Header(version, op, flags, req_id, meta_len, data_len)


def auth_mac(secret: str, nonce: bytes, tenant: str = "") -> bytes:
    """What a client proves it knows its tenant's secret with; the secret itself never travels.
    The tenant name is inside the MAC so a proof for one tenant is worthless for another."""
    if not secret:
        return b""
    return hmac.new(secret.encode(), nonce + b"\0" + tenant.encode(), hashlib.sha256).digest()


def raise_error(msg: ErrorMsg) -> None:
    """Turn a peer's ERROR frame into the matching exception."""
    text = f"pool server: {msg.message}"
    if msg.kind == "auth":
        raise AuthError(text)
    raise ProtocolError(text)
