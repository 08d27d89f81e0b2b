"""Plain-text rendering of the CPU end-to-end report (``driver.run_e2e``'s dict)."""

from __future__ import annotations

from typing import Any


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]
    line = "  ".join(h.rjust(w) for h, w in zip(header, widths))
    body = ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join([line, "  ".join("-" * w for w in widths), *body])


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}x"


def format_report(report: dict[str, Any]) -> str:
    cfg, sg, tot = report["config"], report["sglang"], report["totals"]
    shape = cfg["shape"]
    rate = cfg["prefill_tokens_per_s"]
    tiers = ", ".join(f"{t['kind']}:{t.get('capacity')}" for t in cfg["store_extra_config"]["tiers"])
    out = [
        "CPU end-to-end: SGLang HiCache (real controller and host pool) -> mooncake_sgl tiers",
        f"  model shape   {shape['layers']} layers x {shape['kv_heads']} KV heads x {shape['head_dim']} "
        f"head dim, {shape['dtype']}, {shape['page_size']}-token pages = {_gib(cfg['page_bytes'])} per page",
        f"  sglang        {sg['controller']} + {sg['host_pool']} ({sg['host_pool_pages']} pages = "
        f"{_gib(sg['host_pool_pages'] * cfg['page_bytes'])}), backend {sg['backend_class']}, "
        f"{sg['page_io']}",
        f"  our tiers     {tiers}",
        f"  recompute at  {rate:,.0f} prefill tokens/s (stated assumption: Llama-3-8B on one H100)",
        "",
        "Per round (round 0 computes everything; later rounds revisit every document):",
    ]
    rows = []
    for r in report["rounds"]:
        rows.append([str(r["round"]), str(r["requests"]), f"{r['host_tokens']:,}", f"{r['storage_tokens']:,}",
                     f"{r['computed_tokens']:,}", f"{r['load_s_mean'] * 1e3:.1f}",
                     f"{r['load_s_p50'] * 1e3:.1f}", f"{r['load_s_p99'] * 1e3:.1f}",
                     f"{r['recompute_s_total'] / max(r['requests_with_storage_hits'], 1) * 1e3:.1f}",
                     _ratio(r["load_vs_recompute"])])
    out.append(_table(["round", "reqs", "host(L2) tok", "storage tok", "computed tok", "load ms mean",
                       "p50", "p99", "recompute ms", "load/recompute"], rows))
    out += ["", "Per tier of our store (pages and bytes moved during the run):"]
    page = cfg["page_bytes"]
    trows = []
    for name, t in report["tiers"].items():
        trows.append([name, f"{t['hits']:,}", _gib(t["bytes_read"]), f"{t['writes']:,}",
                      _gib(t["bytes_written"]),
                      f"{t['promotions']:,}", f"{t['demotions']:,}", f"{t['evictions']:,}",
                      f"{t['pages_now']:,}"])
    out.append(_table(["tier", "pages read", "bytes read", "pages written", "bytes written", "promoted",
                       "demoted", "evicted", "pages now"], trows))
    load = tot["load_s_total"]
    out += [
        "",
        f"Totals: {tot['requests']} requests, {tot['prompt_tokens']:,} prompt tokens: "
        f"{tot['host_tokens']:,} from SGLang's host pool, {tot['storage_tokens']:,} from our tiers "
        f"({_gib(tot['storage_tokens'] // shape['page_size'] * page)}), {tot['computed_tokens']:,} computed.",
        f"  load from our tiers: {load:.2f} s for {tot['requests_with_storage_hits']} requests "
        f"({(tot['load_tokens_per_s'] or 0):,.0f} tokens/s); recomputing the same tokens: "
        f"{tot['recompute_s_total']:.2f} s -> load/recompute {_ratio(tot['load_vs_recompute'])}",
        f"  backups (batch_set_v1, off the request path in SGLang): {tot['backup_s_total']:.2f} s; "
        f"SGLang get_stats: {sg['prefetch_pages']:,} pages prefetched, {sg['backup_pages']:,} backed up",
        f"  host pool evictions {report['host_pool_evictions']:,}; loaded pages failing the byte check: "
        f"{report['verify_failures']}; failed backups: {report['backup_failures']}; "
        f"wall {report['wall_s']:.1f} s",
    ]
    mem = report.get("memory", {})
    if mem:
        out.append(f"  memory: peak RSS {_gib(mem['peak_rss_bytes'])}; at the end anonymous "
                   f"{_gib(mem.get('rssanon_bytes', 0))} + shared {_gib(mem.get('rssshmem_bytes', 0))} "
                   f"(pools), file-backed {_gib(mem.get('rssfile_bytes', 0))} (LMDB map: page cache)")
    return "\n".join(out)
