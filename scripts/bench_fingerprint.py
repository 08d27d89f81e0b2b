#!/usr/bin/env python3
"""Cost of the checkpoint fingerprint in the key namespace (``mooncake_sgl.hicache.fingerprint``)
against the baseline it avoids: hashing every byte of the weights.

Writes a synthetic safetensors checkpoint (``--files`` files holding ``--tensors`` tensors in all,
``--gib`` GiB of random bytes) into a temporary directory, then times, side by side and repeated
``--repeat`` times each in turn (A B B A ...): the fingerprint, and BLAKE2b over every weight
file. Both read through the page cache as the machine has it (the file was just written, so mostly
warm); on a cold disk the baseline grows with the checkpoint's size and the fingerprint with its
tensor count. Also prints the bytes each one reads.

    python scripts/bench_fingerprint.py --gib 1 --files 4 --tensors 1000 --json /tmp/fp.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mooncake_sgl.hicache import fingerprint as fp  # noqa: E402

_CHUNK = 8 << 20


def write_checkpoint(root: Path, files: int, tensors: int, total: int) -> None:
    """Safetensors files of equal uint8 tensors, random content, a config.json beside them."""
    import numpy as np

    rng = np.random.default_rng(0)
    per_file = max(1, tensors // files)
    tensor_bytes = max(1, total // (files * per_file))
    (root / "config.json").write_text(json.dumps({"architectures": ["Synthetic"], "tensors": tensors}))
    for f in range(files):
        header = {f"layer.{f}.{t}.weight": {"dtype": "U8", "shape": [tensor_bytes],
                                            "data_offsets": [t * tensor_bytes, (t + 1) * tensor_bytes]}
                  for t in range(per_file)}
        raw = json.dumps(header).encode()
        with open(root / f"model-{f:05d}.safetensors", "wb") as out:
            out.write(struct.pack("<Q", len(raw)) + raw)
            left = per_file * tensor_bytes
            while left:
                n = min(left, _CHUNK)
                out.write(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                left -= n
        print(f"  wrote file {f + 1}/{files}", file=sys.stderr, flush=True)


def hash_everything(root: Path) -> tuple[str, int]:
    h, read = hashlib.blake2b(digest_size=16), 0
    for path in sorted(root.glob("*.safetensors")):
        with open(path, "rb") as f:
            while block := f.read(_CHUNK):
                h.update(block)
                read += len(block)
    return h.hexdigest(), read


def fingerprint_reads(root: Path, tensors: int) -> int:
    """Bytes the fingerprint reads: each file's header and two samples per tensor."""
    headers = 0
    for path in root.glob("*.safetensors"):
        with open(path, "rb") as f:
            headers += 8 + struct.unpack("<Q", f.read(8))[0]
    return headers + tensors * 2 * fp.SAMPLE_BYTES


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="checkpoint size in GiB")
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--tensors", type=int, default=1000, help="tensors over all files")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the results here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mooncake_sgl_fp_") as tmp:
        root = Path(tmp)
        print(f"writing a {args.gib:g} GiB checkpoint of {args.tensors} tensors in {args.files} files",
              file=sys.stderr, flush=True)
        write_checkpoint(root, args.files, args.tensors, int(args.gib * (1 << 30)))
        times: dict[str, list[float]] = {"fingerprint": [], "hash_all": []}
        read_all = 0
        for i in range(args.repeat):
            for name in (("fingerprint", "hash_all") if i % 2 == 0 else ("hash_all", "fingerprint")):
                start = time.perf_counter()
                if name == "fingerprint":
                    fp.fingerprint(fp.ModelSource(model_path=str(root)))
                else:
                    _, read_all = hash_everything(root)
                times[name].append(time.perf_counter() - start)
            print(f"  round {i + 1}/{args.repeat}", file=sys.stderr, flush=True)
        sampled = fingerprint_reads(root, args.tensors)
    best = {k: min(v) for k, v in times.items()}
    result = {"gib": args.gib, "files": args.files, "tensors": args.tensors,
              "seconds": times, "best_s": best,
              "bytes_read": {"fingerprint": sampled, "hash_all": read_all},
              "speedup": best["hash_all"] / best["fingerprint"]}
    print(f"{'':14}{'fingerprint':>14}{'hash all':>14}")
    print(f"{'best s':14}{best['fingerprint']:>14.4f}{best['hash_all']:>14.4f}")
    print(f"{'bytes read':14}{result['bytes_read']['fingerprint']:>14,}{read_all:>14,}")
    print(f"fingerprint is {result['speedup']:.0f}x faster here")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
