"""The SSD modes of ``scripts/bench_tiers.py``: their options, the child processes they start (the
script runs itself with a verb), the order they run in, and their tables.

``add_arguments`` adds the options, ``parsed`` checks them (a usage error names the option), ``run``
runs the modes asked for and returns their results under their JSON names, ``tables`` prints them.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mooncake_sgl.config import parse_size

from . import disk_speed as ssd_disk_speed
from . import read_path as ssd_read_path
from . import throttled as ssd_throttled
from . import user_view as ssd_user_view
from . import write_path as ssd_write_path

MODES = ("user-view", "throttled", "restart", "put-profile", "get-profile", "backlog", "disk-speed")
# JSON names, in the order the modes run.
RESULTS = ("user_view", "throttled", "put_profile", "get_profile", "backlog", "restart", "disk_speed")


def child(argv: list[str]) -> bool:
    """Run the child process ``argv`` names (``_user-view ...``); ``False`` if it names none."""
    verb, rest = (argv[0], argv[1:]) if argv else ("", [])
    if verb == "_user-view":
        ssd_user_view.child_main(rest)
    elif verb == "_restart":
        ssd_user_view.restart_child(rest[0], int(rest[1]))
    elif verb == "_restart-fill":
        ssd_user_view.restart_fill(rest[0], *map(int, rest[1:5]))
    elif verb == "_put-profile":
        ssd_write_path.profile_child(rest[0], *map(int, rest[1:4]), rest[4] == "1")
    elif verb == "_get-profile":
        ssd_read_path.profile_child(rest[0], *map(int, rest[1:4]))
    elif verb == "_backlog":
        ssd_write_path.backlog_child(rest[0], rest[1], int(rest[2]), int(rest[3]), float(rest[4]),
                                     float(rest[5]), int(rest[6]), int(rest[7]))
    elif verb == "_disk-speed":
        ssd_disk_speed.child(rest)
    else:
        return False
    return True


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--user-view-pages", default="64KiB:2048,1MiB:512,8MiB:96",
                   help="user-view, put-profile, get-profile, throttled: page sizes and counts, "
                        "SIZE:COUNT comma separated")
    p.add_argument("--disk-speed-pages", default="64KiB:12288,1MiB:768,8MiB:96",
                   help="disk-speed: page sizes and counts, SIZE:COUNT comma separated; all pages of "
                        "a size go in one put_from and one get_into")
    p.add_argument("--disk-speed-dd-bs", default="8MiB", help="disk-speed: dd's block size")
    p.add_argument("--disk-speed-loop-readahead", type=int, default=None, metavar="KB",
                   help="disk-speed: run on a fresh ext4 on a loop device over the scratch disk, its "
                        "read_ahead_kb set to KB (root; 128 is most disks' default)")
    p.add_argument("--disk-speed-memory", default="aligned", choices=("aligned", "unaligned"),
                   help="disk-speed: the pages' memory: page-aligned (SGLang's pinned host pool) or "
                        "not (plain malloc, as CPU tensors)")
    p.add_argument("--throttle-mbps", default="0,300", help="throttled: the loop device's read and "
                   "write limits in MB/s, a user-view run each, comma separated (0: unthrottled)")
    p.add_argument("--restart-gib", type=float, default=10.0, help="restart mode: GiB of pages on disk")
    p.add_argument("--restart-page", default="8MiB", help="restart mode: page size")
    p.add_argument("--backlog-rate", default=None, help="backlog: GB/s offered, comma separated for "
                   "several runs (default 1.5, --quick 0.2; a GPU's write-through: 10k tokens/s of "
                   "Llama-3-8B is about 1.3)")
    p.add_argument("--backlog-page", default="8MiB", help="backlog: page size")
    p.add_argument("--backlog-batch", type=int, default=16, help="backlog: pages per offered batch")
    p.add_argument("--backlog-seconds", type=float, default=4.0, help="backlog: seconds of offering")
    p.add_argument("--backlog-queue", default="1GiB", help="backlog: bytes the queue holds before "
                   "offered batches are dropped (arbitrary)")
    p.add_argument("--backlog-capacity", default="2GiB", help="backlog: disk each consumer writes "
                   "in a ring (the tier's capacity)")
    p.add_argument("--backlog-direct-io", default="auto", help="backlog: the tier's direct_io "
                   "settings to run, a row each (auto, direct, buffered; comma separated)")


def quick(args: argparse.Namespace) -> None:
    """``--quick``: CI sizes for every SSD mode."""
    args.user_view_pages, args.restart_gib, args.restart_page = "64KiB:64,1MiB:16", 0.0625, "1MiB"
    args.disk_speed_pages, args.disk_speed_dd_bs = "64KiB:64,1MiB:16", "1MiB"
    args.backlog_page, args.backlog_batch, args.backlog_seconds = "1MiB", 4, 0.5
    args.backlog_queue, args.backlog_capacity = "16MiB", "32MiB"
    args.backlog_rate = args.backlog_rate or "0.2"


def _pages(p: argparse.ArgumentParser, flag: str, text: str) -> list[tuple[int, int]]:
    try:
        sizes = [(parse_size(a), int(b)) for a, b in
                 (item.split(":") for item in text.split(",") if item.strip())]
    except ValueError:
        p.error(f"{flag}: expected SIZE:COUNT pairs like 1MiB:512, got {text!r}")
    if not sizes or any(s % 2 or s <= 0 or c <= 0 for s, c in sizes):
        p.error(f"{flag}: sizes must be positive and even, counts positive")
    return sizes


def parsed(p: argparse.ArgumentParser, args: argparse.Namespace, modes: set[str]) -> dict:
    """The SSD options as values; a usage error (exit 2) naming the option that is wrong."""
    args.backlog_rate = args.backlog_rate or "1.5"
    out: dict = {"uv_sizes": _pages(p, "--user-view-pages", args.user_view_pages),
                 "disk_sizes": _pages(p, "--disk-speed-pages", args.disk_speed_pages)}
    try:
        out["backlog_rates"] = [float(r) for r in args.backlog_rate.split(",") if r.strip()]
    except ValueError:
        p.error(f"--backlog-rate: expected GB/s figures like 1.5,0.5, got {args.backlog_rate!r}")
    if not out["backlog_rates"] or any(r <= 0 for r in out["backlog_rates"]):
        p.error(f"--backlog-rate: every rate must be positive, got {args.backlog_rate!r}")
    try:
        out["throttle_rates"] = ssd_throttled.parse_rates(args.throttle_mbps)
    except ValueError:
        p.error(f"--throttle-mbps: expected MB/s figures like 0,300 (0 or more), got {args.throttle_mbps!r}")
    if "throttled" in modes and (why := ssd_throttled.unavailable()):
        p.error(f"--modes throttled {why}")
    if args.disk_speed_loop_readahead is not None:
        if args.disk_speed_loop_readahead < 0:
            p.error("--disk-speed-loop-readahead: must be 0 or more KiB")
        if why := ssd_throttled.unavailable():
            p.error(f"--disk-speed-loop-readahead {why}")
    try:
        out["dd_bs"] = parse_size(args.disk_speed_dd_bs)
    except ValueError:
        p.error(f"--disk-speed-dd-bs: expected a size like 8MiB, got {args.disk_speed_dd_bs!r}")
    return out


def run(modes: set[str], args: argparse.Namespace, values: dict, script: str, workdir: Path,
        hicache_file: bool) -> dict:
    """The SSD modes in ``modes``, each result under its JSON name (``None``: not run)."""
    out: dict = dict.fromkeys(RESULTS)
    uv, batch = values["uv_sizes"], args.batch_size
    if "user-view" in modes:
        out["user_view"] = ssd_user_view.user_view(script, uv, args.batches, batch, workdir, hicache_file)
    if "throttled" in modes:
        out["throttled"] = ssd_throttled.throttled(script, uv, args.batches, batch, values["throttle_rates"],
                                                   workdir, hicache_file)
    if "put-profile" in modes:
        out["put_profile"] = ssd_write_path.put_profile(script, uv, batch, workdir)
    if "get-profile" in modes:
        out["get_profile"] = ssd_read_path.get_profile(script, uv, batch, workdir)
    if "backlog" in modes:
        out["backlog"] = ssd_write_path.backlog(
            script, parse_size(args.backlog_page), args.backlog_batch, values["backlog_rates"],
            args.backlog_seconds, parse_size(args.backlog_queue), parse_size(args.backlog_capacity),
            args.batches, workdir, [m.strip() for m in args.backlog_direct_io.split(",") if m.strip()])
    if "restart" in modes:
        out["restart"] = ssd_user_view.restart(script, args.restart_gib, parse_size(args.restart_page),
                                               batch, workdir)
    if "disk-speed" in modes:
        out["disk_speed"] = ssd_disk_speed.disk_speed(script, values["disk_sizes"], args.batches, workdir,
                                                      values["dd_bs"], args.disk_speed_memory,
                                                      args.disk_speed_loop_readahead)
    return out


def tables(res: dict) -> list[str]:
    """The tables of the modes that ran, in the order they ran."""
    out = []
    if res["user_view"] is not None:
        out.append(ssd_user_view.user_view_table(res["user_view"]))
    if res["throttled"] is not None:
        out.append(ssd_throttled.throttled_table(res["throttled"]))
    if res["put_profile"] is not None:
        out.append(ssd_write_path.put_profile_table(res["put_profile"]))
    if res["get_profile"] is not None:
        out.append(ssd_read_path.get_profile_table(res["get_profile"]))
    out.extend(ssd_write_path.backlog_table(at_rate) for at_rate in res["backlog"] or [])
    if (restart := res["restart"]) is not None:
        out.append(f"restart: {restart['pages_written']} pages of {restart['page']} "
                   f"({restart['bytes_on_disk'] / 2**30:.1f} GiB on disk, cache dropped by "
                   f"{restart['cache_dropped_by']}): first hit {restart['first_hit_s']:.3f}s after open "
                   f"(open {restart['open_s']:.3f}s), {restart['pages_recovered']} pages recovered, "
                   f"listed in {restart['scan_s']:.3f}s")
    if res["disk_speed"] is not None:
        out.append(ssd_disk_speed.disk_speed_table(res["disk_speed"]))
    return out
