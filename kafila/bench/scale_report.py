"""The printed report of `kafila bench scale`: the run's one probe, each model's tables, then every model together.

It reads the figures `kafila.bench.scale.run` gathered and judged (the same dicts --json writes).
"""

from __future__ import annotations

from typing import Any


def print_run(probe: dict[str, Any], runs: list[dict[str, Any]], pooled: dict[str, Any]) -> None:
    """The whole report, to stdout."""
    from rich.console import Console

    out = Console()
    # a probe whose cuts fit its cost model badly was taken while the machine's speed moved
    out.print(f"probe, one for every model: decode reads {probe['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, "
              f"fit error {probe['fit_residual']:.2%}")
    for r in runs:
        print_report(r, out)
    if len(runs) > 1:
        print_pooled(runs, pooled, out)


def print_pooled(runs: list[dict[str, Any]], pooled: dict[str, Any], out: Any) -> None:
    """Each model's targets met, and the stage-time error over all of them."""
    from rich.table import Table

    table = Table("model", "targets met", "stage time error (median)", title="every model of this run, one probe")
    for r in runs:
        judged = [t["met"] for t in r["targets"].values() if t["met"] is not None]
        err = r["targets"]["stage_time_error"]["value"]
        table.add_row(f"{r['shape']}, {r['blocks']} blocks", f"{sum(judged)} of {len(judged)}",
                      "—" if err is None else f"{err:.1%}")
    t = pooled["stage_time_error"]
    table.add_row("all stages", "", "—" if t["value"] is None else
                  f"{t['value']:.1%} " + ("[green]met[/]" if t["met"] else "[red]missed[/]"))
    out.print(table)


def print_report(r: dict[str, Any], out: Any) -> None:
    """One model's tables: stage delivery, peak memory, decode and TTFT, replies, stage times, targets."""
    from rich.table import Table

    from kafila.bench.scale_ring import head_ttft

    ring, slow, local, quic = r["ring"], r["ring_slowed"], r["local"], r["aioquic"]
    weights = "random weights, Q4_0" if r["random_weights"] else "real weights"
    out.print(f"{r['shape']}, {r['blocks']} blocks, {r['model_bytes'] / 1e6:.0f} MB ({weights}); "
              f"context {r['context']}, n_batch {r['n_batch']}, {r['threads']} threads")
    for label, run in (("ring without slow-downs", ring), ("ring with slow-downs", slow)):
        if not run.get("ok"):
            out.print(f"[red]{label} failed:[/] {run.get('error') or run['ttft'].get('error')}")
    table = Table("member", "stage MB", "cut s", "delivery s", "MB/s", "until loaded s",
                  "RSS before → peak in delivery (MB)",
                  title=f"stage delivery (aioquic alone: {quic['mb_per_s']:.1f} MB/s, one Kafila link: "
                        f"{r['delivery_one_link']['mb_per_s']:.1f} MB/s, {quic['datagram_bytes']}-byte datagrams)")
    for n, d in ring["delivery"].items():
        m = ring["delivery_rss_mb"].get(n)
        table.add_row(n, f"{d['bytes'] / 1e6:.1f}", f"{d['cut_s']:.1f}", f"{d['delivery_s']:.1f}",
                      f"{d['mb_per_s']:.1f}", "—" if d["loaded_s"] is None else f"{d['loaded_s']:.1f}",
                      f"{m['before']:.0f} → {m['peak']:.0f}" if m else "too quick to sample")
    out.print(table)
    for n, d in ring["delivery_incomplete"].items():
        out.print(f"stage to {n}: {d['bytes_sent'] / 1e6:.1f} of {d['bytes'] / 1e6:.1f} MB sent in "
                  f"{d['seconds']:.0f} s, then the session ended")
    table = Table("process", "peak RSS MB", title="peak memory (unthrottled ring; local context)")
    for n, mb in ring["peak_rss_mb"].items():
        table.add_row(n, f"{mb:.0f}")
    table.add_row("local context", f"{local['peak_rss_mb']:.0f}")
    out.print(table)
    table = Table("figure", "ring", "local", "", title="decode and time to first token")
    decode = ring.get("decode") or {}
    dec, dec_local = decode.get("ms_per_token"), decode.get("local_ms_per_token")
    floor = r.get("pipe_floor") or {}
    table.add_row("decode ms/token (median)", f"{dec:.1f}" if dec else "—", f"{dec_local:.1f}" if dec_local else "—",
                  f"pipe floor {floor['ms_per_token']:.1f}" if floor else "")
    for label, which in (("TTFT s, no slow-down", ring), (f"TTFT s, slow-downs {r['throttles']}", slow)):
        t, at_head = which["ttft"], head_ttft(which["ttft"])
        pred = which.get("plan_ttft_s")
        table.add_row(f"{label} ({local['prompt_tokens']} tokens)",
                      f"{t['ttft_s']:.2f}" if t.get("ok") else f"failed: {t.get('error')}", f"{local['ttft_s']:.2f}",
                      (f"at the head {at_head:.2f}" if at_head else "") + (f", predicted {pred:.2f}" if pred else ""))
    out.print(table)
    out.print(f"llama-cpp-python's greedy reply ({local.get('reply_tokens')} tokens): {local.get('reply')!r}")
    for key, label in (("ring", "ring without slow-downs"), ("ring_slowed", "ring with slow-downs")):
        rep = r["replies"][key]
        verdict = {True: "[green]identical[/]", False: "[red]differs[/]", None: "no reply"}[rep["identical"]]
        out.print(f"{label}: {verdict}" + ("" if rep["identical"] else f" {rep['reply']!r}"))
    if r["stage_times"]:
        table = Table("stage", "predicted ms", "measured ms", "error", "alone ms", "error alone",
                      title="predicted vs measured stage time (in the ring; alone: the same stage in the pipe floor)")
        for n, e in r["stage_times"].items():
            alone = e.get("alone_ms")
            table.add_row(n, f"{e['predicted_ms']:.1f}", f"{e['measured_ms']:.1f}", f"{e['error']:.0%}",
                          "—" if alone is None else f"{alone:.1f}",
                          "—" if alone is None else f"{e['alone_error']:.0%}")
        out.print(table)
    table = Table("target", "value", "", title="issue 11's targets")
    for t in r["targets"].values():
        v = t["value"]
        table.add_row(t["target"], "—" if v is None else f"{v:.2f}",
                      {True: "[green]met[/]", False: "[red]missed[/]", None: "not measured"}[t["met"]])
    out.print(table)
