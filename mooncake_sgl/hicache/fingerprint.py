"""A cheap fingerprint of the checkpoint a server runs, for the key namespace (``KeyNamespace.weights``).

Why: SGLang names the model to storage by its served name (by default the model path). Weights
replaced in place, or one served name reused for another checkpoint on a shared pool or Mooncake
Store, would otherwise be served the old weights' KV.

What it covers, exactly (each as content, never as a file time, so the same checkpoint copied to
several hosts has one fingerprint and their servers share pages through a cluster tier):

- the checkpoint directory's top-level ``config.json`` and ``params.json``, every ``*.index.json``
  (which tensor is in which file) and every ``*.json`` whose name contains ``quant`` (quantization
  configs): their whole content;
- every top-level weight file (``*.safetensors``, ``*.bin``, ``*.pt``, ``*.pth``, ``*.gguf``): name
  and size, and for safetensors the whole header (tensor names, dtypes, shapes, offsets) plus
  ``SAMPLE_BYTES`` bytes at the start and at the middle of every tensor; other formats
  ``GENERIC_SAMPLES`` evenly spaced samples of ``SAMPLE_BYTES`` (first and last included). A model
  path that is one file (a GGUF) is that weight file;
- the KV-scale file (``--quantization-param-path``): its whole content;
- the server arguments that change KV for the same files: ``--revision``, ``--quantization``,
  ``--dtype``, ``--kv-cache-dtype``, ``--load-format``, ``--json-model-override-args``;
- the same for the speculative draft model when one is set (its KV is a sidecar of this
  namespace);
- a Hugging Face repo id is looked up in the local hub cache (no network): the snapshot directory
  found there is fingerprinted as above, and its name (the commit) recorded. Not cached locally: only
  the id and revision count, and the attach log says the weights were not identified.

Cost: a few small reads per tensor (a 100 GB model of about 1,000 tensors: about 2,000 reads of 4 KiB
pages), never a pass over the weights. What it cannot see: a change to a tensor that leaves its
sampled bytes, its size and the header alike (say, a few edited rows deep inside one tensor), and
weights outside the top-level directory. Files are read as they are; a file that cannot be read
counts as its name and the error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SAMPLE_BYTES = 64  # per safetensors sample: 32 bf16 values, enough to tell retrained tensors apart
GENERIC_SAMPLES = 16  # per weight file of a format without a tensor index
GENERIC_SAMPLE_BYTES = 4096
DIGEST_BYTES = 16
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
CONFIG_NAMES = ("config.json", "params.json")
_WHOLE_FILE_LIMIT = 64 << 20  # a "config" larger than this is sampled like a weight file
_SAFETENSORS_HEADER_LIMIT = 100 << 20  # the format's own cap on its header


@dataclass(frozen=True)
class ModelSource:
    """What SGLang loads: the checkpoint and the arguments that change its KV."""

    model_path: str
    revision: str | None = None
    quantization: str | None = None
    dtype: str | None = None
    kv_cache_dtype: str | None = None
    load_format: str | None = None
    json_model_override_args: str | None = None
    quantization_param_path: str | None = None
    download_dir: str | None = None
    draft_model_path: str | None = None
    draft_revision: str | None = None


@dataclass(frozen=True)
class Fingerprint:
    digest: str  # hex; "" when no source was known (the namespace then has no fingerprint)
    summary: str  # one line for the attach log: what was covered


def _bag_value(bag: Any, name: str) -> str | None:
    # A ``_ConfigBag`` holds what this server published, which differs by release and by launch.
    value = getattr(bag, name, None)
    return None if value is None else str(value)


def model_source(model_name: str) -> ModelSource | None:
    """The running server's model, from SGLang's published model config (scheduler processes);
    outside a server, ``model_name`` (the storage config's) when it names a local path; else
    ``None``."""
    try:
        from sglang.srt.runtime_context import get_model, get_spec

        model = get_model()
        path = _bag_value(model, "model_path")
    except Exception:  # not a server process, or an sglang without the runtime context
        path = None
    if path:
        try:
            spec = get_spec()
            draft, draft_rev = (_bag_value(spec, "speculative_draft_model_path"),
                                _bag_value(spec, "speculative_draft_model_revision"))
        except Exception:
            draft = draft_rev = None
        return ModelSource(
            model_path=path, revision=_bag_value(model, "revision"),
            quantization=_bag_value(model, "quantization"), dtype=_bag_value(model, "dtype"),
            kv_cache_dtype=_bag_value(model, "kv_cache_dtype"),
            load_format=_bag_value(model, "load_format"),
            json_model_override_args=_bag_value(model, "json_model_override_args"),
            quantization_param_path=_bag_value(model, "quantization_param_path"),
            download_dir=_bag_value(model, "download_dir"), draft_model_path=draft,
            draft_revision=draft_rev)
    if model_name and os.path.exists(model_name):
        return ModelSource(model_path=model_name)
    return None


def checkpoint_fingerprint(model_name: str) -> Fingerprint:
    """The fingerprint of the model this server runs (``model_name``: the storage config's). Never
    raises: what cannot be read is recorded as such (and so still differs from what could)."""
    source = model_source(model_name)
    if source is None:
        return Fingerprint("", "none (no model path known: not inside an SGLang server, and the "
                               f"model name {model_name!r} is not a local path)")
    try:
        return fingerprint(source)
    except Exception as e:  # a bug here must not stop the server; the name still keys the pages
        logger.warning("mooncake_sgl: model fingerprint failed (%s: %s); keys carry the model name "
                       "only", type(e).__name__, e)
        return Fingerprint("", f"none (failed: {type(e).__name__}: {e})")


def fingerprint(source: ModelSource) -> Fingerprint:
    """Fingerprint of ``source`` (see the module docstring for what it covers)."""
    started = time.monotonic()
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    stats = _Stats()

    def feed(label: str, value: bytes | str | None) -> None:
        data = value.encode() if isinstance(value, str) else (b"\xff" if value is None else value)
        h.update(label.encode() + b"\0" + len(data).to_bytes(8, "big") + data)

    for label, value in _arguments(source):
        feed(label, value)
    for label, data in _checkpoint("model", source.model_path, source.revision, source.download_dir,
                                   stats):
        feed(label, data)
    if source.quantization_param_path:
        feed("kv_scales", _whole(Path(source.quantization_param_path), stats))
    if source.draft_model_path:
        for label, data in _checkpoint("draft", source.draft_model_path, source.draft_revision,
                                       source.download_dir, stats):
            feed(label, data)
    digest = h.hexdigest()
    summary = (f"{digest} over {stats.describe()}, revision={source.revision}, "
               f"quantization={source.quantization}, kv_cache_dtype={source.kv_cache_dtype}"
               f"{', draft ' + source.draft_model_path if source.draft_model_path else ''} "
               f"({time.monotonic() - started:.2f} s)")
    if stats.unidentified:
        logger.warning("mooncake_sgl: weights not identified, keys carry only %s",
                       "; ".join(stats.unidentified))
    return Fingerprint(digest, summary)


def _arguments(source: ModelSource) -> Iterator[tuple[str, str | None]]:
    override = source.json_model_override_args
    if override:
        try:  # the same overrides written another way are the same model
            override = json.dumps(json.loads(override), sort_keys=True)
        except ValueError:
            pass
    yield from (("revision", source.revision), ("quantization", source.quantization),
                ("dtype", source.dtype), ("kv_cache_dtype", source.kv_cache_dtype),
                ("load_format", source.load_format), ("json_model_override_args", override),
                ("draft_revision", source.draft_revision))


class _Stats:
    def __init__(self) -> None:
        self.configs = 0
        self.weight_files = 0
        self.weight_bytes = 0
        self.tensors = 0
        self.unidentified: list[str] = []

    def describe(self) -> str:
        return (f"{self.configs} config file(s), {self.weight_files} weight file(s) "
                f"({self.weight_bytes / 2**30:.2f} GiB, {self.tensors} tensors sampled)")


def _checkpoint(role: str, path: str, revision: str | None, download_dir: str | None,
                stats: _Stats) -> Iterator[tuple[str, bytes | str]]:
    local = Path(path)
    if not local.exists():
        snapshot = _hub_snapshot(path, revision, download_dir)
        if snapshot is None:
            stats.unidentified.append(f"{role} {path!r} at revision {revision} (not a local path, "
                                      "not in the local Hugging Face cache)")
            yield f"{role}.id", path
            return
        yield f"{role}.hub_commit", snapshot.name
        local = snapshot
    if local.is_file():
        yield f"{role}.file", local.name
        yield from _weight_file(f"{role}.weights", local, stats)
        return
    for entry in sorted(local.iterdir(), key=lambda p: p.name):
        if not entry.is_file():
            continue
        name = entry.name
        if name in CONFIG_NAMES or name.endswith(".index.json") or (
                name.endswith(".json") and "quant" in name.lower()):
            stats.configs += 1
            yield f"{role}.config/{name}", _whole(entry, stats)
        elif name.endswith(WEIGHT_SUFFIXES):
            yield from _weight_file(f"{role}.weights/{name}", entry, stats)


def _hub_snapshot(repo_id: str, revision: str | None, cache_dir: str | None) -> Path | None:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id=repo_id, revision=revision, cache_dir=cache_dir,
                                      local_files_only=True))
    except Exception:  # not installed, not a repo id, not cached: the caller records the id
        return None


def _whole(path: Path, stats: _Stats) -> bytes:
    try:
        size = path.stat().st_size
        if size > _WHOLE_FILE_LIMIT:
            return b"".join(d if isinstance(d, bytes) else d.encode()
                            for _, d in _weight_file("large", path, stats))
        return path.read_bytes()
    except OSError as e:
        return f"unreadable: {e.strerror or e}".encode()


def _weight_file(label: str, path: Path, stats: _Stats) -> Iterator[tuple[str, bytes | str]]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        yield label, f"unreadable: {e.strerror or e}"
        return
    try:
        size = os.fstat(fd).st_size
        stats.weight_files += 1
        stats.weight_bytes += size
        yield f"{label}.size", str(size)
        samples = _safetensors_samples(fd, size, stats) if path.suffix == ".safetensors" else None
        if samples is None:
            samples = _even_samples(fd, size)
        yield f"{label}.samples", samples
    except OSError as e:
        yield label, f"unreadable: {e.strerror or e}"
    finally:
        os.close(fd)


def _safetensors_samples(fd: int, size: int, stats: _Stats) -> bytes | None:
    """Header plus two samples per tensor; ``None`` when the file is not valid safetensors."""
    if size < 8:
        return None
    (header_len,) = struct.unpack("<Q", os.pread(fd, 8, 0))
    if header_len > min(_SAFETENSORS_HEADER_LIMIT, size - 8):
        return None
    header = os.pread(fd, header_len, 8)
    try:
        tensors = json.loads(header)
        spans = sorted((int(t["data_offsets"][0]), int(t["data_offsets"][1]))
                       for name, t in tensors.items() if name != "__metadata__")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None
    base = 8 + header_len
    out = [header]
    for begin, end in spans:
        n = max(0, end - begin)
        take = min(SAMPLE_BYTES, n)
        out.append(os.pread(fd, take, base + begin))
        out.append(os.pread(fd, take, base + begin + (n - take) // 2))
    stats.tensors += len(spans)
    return b"".join(out)


def _even_samples(fd: int, size: int) -> bytes:
    if size <= GENERIC_SAMPLES * GENERIC_SAMPLE_BYTES:
        return os.pread(fd, size, 0)
    last = size - GENERIC_SAMPLE_BYTES
    return b"".join(os.pread(fd, GENERIC_SAMPLE_BYTES, i * last // (GENERIC_SAMPLES - 1))
                    for i in range(GENERIC_SAMPLES))
