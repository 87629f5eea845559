"""`kafila bench wan`: the demo ring with its members far apart (EMULATION: `--link-delay`), speculation off
against on.

For each one-way delay per member link (default 0, 10 and 40 ms) one ring of three members serves, one
request at a time, input-grounded prompts (a paragraph to correct, to rewrite, to repeat, a list to extract,
a function to edit) and free chat prompts, each with speculation off, `lookup` and `auto` (the request's
`speculate` field); then four grounded requests at once, off and auto. At the farthest delay a second
ring's head drafts with a draft model (`--draft`, by default the target itself: the machinery's ceiling,
acceptance near 1), and a draft model of another vocabulary (Gemma 3 270M) must be refused, both
named. Reported per delay and mode:
single-user tokens/s (decode: first token to last), drafted and accepted tokens, tokens per circuit,
TTFT, the network's share of a circuit, the 4-user aggregate, and the time per token the plan predicts
(its stage times per computed row, and per circuit the edges' share: the serving ring's time outside compute,
measured on a warm-up reply) against the measured one. Every greedy reply is compared with llama-cpp-python's own.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafila.bench.replies import greedy_reply

if TYPE_CHECKING:
    from kafila.session.state import SessionState

HELP = "members far apart (emulated link delays): tokens/s with speculation off, lookup and auto"
GROUNDED = {
    "edit": "Fix the spelling mistakes in this paragraph and write the corrected paragraph:\n\nThe quick brwon fox "
            "jumpd over the lazzy dog while the farmer wachted from the feild. Later that day, the fox returnd to "
            "its den and slept untill the next mornning.",
    "rewrite": "Rewrite this paragraph in the past tense:\n\nThe river runs through the old town. Children play on "
               "its banks and fishermen sit by the bridge. In the evening, the lights of the houses shine on the "
               "water and the town grows quiet.",
    "repeat": "Repeat this text exactly, word for word:\n\nKafila pools ordinary laptops, desktops and "
              "workstations into one ring that serves a large language model none of them could run alone. It "
              "measures each machine, plans the split, and connects members behind different NATs.",
    "extract": "List every city named in this text, one per line:\n\nThe train left Paris at dawn, stopped in Lyon "
               "and Marseille, and reached Nice by noon. From there the travellers flew to Rome, then took a bus to "
               "Naples and a ferry to Palermo.",
    "code": "Rename the variable x to total in this Python function and print the whole function:\n\n"
            "def add_all(values):\n    x = 0\n    for v in values:\n        x = x + v\n    print(x)\n    return x\n",
}
FREE = {
    "river": "Name a river.",
    "health": "What are three tips for staying healthy?",
    "bicycle": "Explain how a bicycle works.",
}
MODES = ("off", "lookup", "auto")
CONTEXT = 1024
OTHER_VOCABULARY = "gemma3"  # a draft model the bench's SmolLM2 target must refuse


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--delays", default="0,10,40", help="EMULATION: one-way ms per member link, one ring each")
    p.add_argument("--tokens", type=int, default=64, help="tokens per reply (default 64)")
    p.add_argument("--draft", default=None, metavar="PATH",
                   help="the draft model of the draft-model ring (default: the target itself, the ceiling)")


async def _together(url: str, prompts: list[str], tokens: int, mode: str) -> tuple[float, float | None]:
    """Aggregate tokens/s of the prompts sent at once, and the median compute share of their circuits: what this
    machine's shared cores serialize (the rest, the links' delays, overlaps as on separate machines)."""
    t0 = time.perf_counter()
    replies = await asyncio.gather(*(greedy_reply(url, p, tokens, speculate=mode) for p in prompts))
    rate = sum(int(r.get("completion_tokens") or 0) for r in replies) / (time.perf_counter() - t0)
    shares = [r["network_share"] for r in replies if r.get("network_share") is not None]
    return rate, 1 - statistics.median(shares) if shares else None


def _summary(replies: list[dict[str, Any]], truth: dict[str, str], token_time: dict[str, Any] | None) -> dict:
    """One mode's figures over a group of prompts (decode tokens over decode seconds, summed)."""
    decode_tokens = sum(max(int(r["completion_tokens"]) - 1, 0) for r in replies)
    decode_s = sum((int(r["completion_tokens"]) - 1) / r["tokens_per_s"] for r in replies if r.get("tokens_per_s"))
    spec = [r["speculation"] for r in replies]
    circuits, rows = sum(s["circuits"] for s in spec), sum(s["rows"] for s in spec)
    drafted, accepted = sum(s["drafted"] for s in spec), sum(s["accepted"] for s in spec)
    out: dict[str, Any] = {
        "tokens_per_s": decode_tokens / decode_s if decode_s else None,
        "identical": [r["name"] for r in replies if r["text"] == truth[r["name"]]],
        "different": [r["name"] for r in replies if r["text"] != truth[r["name"]]],
        "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None,
        "tokens_per_circuit": decode_tokens / circuits if circuits else None,
        "ttft_s": statistics.median(r["ttft"]["measured_s"] for r in replies if r.get("ttft")),
        "network_share": statistics.median(r["network_share"] for r in replies if r.get("network_share") is not None),
    }
    if token_time and decode_tokens:
        # each circuit pays the edges once and every stage once per row it carries, and the draft model's
        # time on the request (its catching up with each prompt included)
        drafting = sum(s["drafting_s"] for s in spec)
        def per_token(edges_s: float) -> float:
            return (circuits * edges_s + rows * token_time["stages_s"] + drafting) / decode_tokens

        predicted, measured = per_token(token_time["edges_s"]), decode_s / decode_tokens
        out |= {"predicted_s_per_token": predicted, "measured_s_per_token": measured,
                "prediction_error": (measured - predicted) / predicted}
        if token_time.get("edges_quic_s") is not None:  # the links' round trips alone, for comparison
            out["predicted_quic_s_per_token"] = per_token(token_time["edges_quic_s"])
    return out


def _measured_token_time(state: SessionState, wait_s: float = 5.0) -> dict[str, Any] | None:
    """The plan's token time once the head has reported its circuits (it does each second); the QUIC round
    trips' prediction if it has not within `wait_s`."""
    deadline = time.monotonic() + wait_s
    while (state.token_time() or {}).get("edges_from") != "circuits" and time.monotonic() < deadline:
        time.sleep(0.1)
    return state.token_time()


def _ring(delay_ms: float, tokens: int, truth: dict[str, str], fresh: bool, modes: tuple[str, ...] = MODES,
          draft: Path | None = None) -> dict[str, Any]:
    from kafila.errors import SessionError
    from kafila.session.launch.demo import DemoMember, DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread

    members = tuple(DemoMember(n, 1.0, link_delay_ms=delay_ms) for n in ("ada", "bo", "cy"))
    opts = DemoOptions(members=members, api_port=0, context=CONTEXT, fresh_probe=fresh, draft=draft)
    with SessionThread(lambda state: run_demo(opts, state)) as s:
        state = s.wait_settled(600)
        if state.phase != "admitted":
            raise SessionError(f"the bench ring was not admitted: {state.rejection or state.lost}")
        url = state.api_url or ""
        # warm-up: the serving ring's circuits measured outside compute, the edges' share of the prediction
        asyncio.run(greedy_reply(url, "Count from one to twenty.", 24, speculate="off"))
        token_time = _measured_token_time(state)
        result: dict[str, Any] = {"delay_ms": delay_ms, "plan_token_time": token_time,
                                  "draft": None if draft is None else draft.name}
        for group, prompts in (("grounded", GROUNDED), ("free", FREE)):
            replies: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
            for name, p in prompts.items():
                for mode in modes:  # each prompt in every mode in turn: the machine's drift hits all modes alike
                    replies[mode].append({"name": name, **asyncio.run(greedy_reply(url, p, tokens, speculate=mode))})
            result[group] = {mode: _summary(replies[mode], truth, token_time) for mode in modes}
        if draft is None:
            four = list(GROUNDED.values())[:4]
            together = {mode: asyncio.run(_together(url, four, tokens, mode)) for mode in ("off", "auto")}
            result["four_users"] = {mode: rate for mode, (rate, _) in together.items()}
            result["four_users"]["compute_share"] = {mode: share for mode, (_, share) in together.items()}
            result["four_users"]["auto_vs_off"] = together["auto"][0] / together["off"][0]
    for group in ("grounded", "free"):
        off = result[group]["off"]["tokens_per_s"]
        for mode in modes:
            r = result[group][mode]
            r["vs_off"] = r["tokens_per_s"] / off if off and r["tokens_per_s"] else None
    return result


def _refusal(target: Path) -> str | None:
    """What the head says of a draft model of another vocabulary (None: it was not refused)."""
    from kafila.engine.draft import DraftModel
    from kafila.engine.reference import ReferenceContext
    from kafila.engine.stage import ContextConfig
    from kafila.engine.vocab import Vocab
    from kafila.model.embedded import resolve_model

    config = ContextConfig(n_ctx_per_seq=256, n_seq_max=1, n_batch=64)
    ref, other = ReferenceContext(target, config), DraftModel(resolve_model(OTHER_VOCABULARY), config)
    try:
        return other.refusal(Vocab(ref.vocab, None), target)
    finally:
        other.close()
        ref.close()


def _targets(rings: list[dict[str, Any]], drafted: dict[str, Any], refusal: str | None) -> dict[str, Any]:
    """The acceptance lines of issue #33 this bench judges."""
    by = {r["delay_ms"]: r for r in rings}
    far, near = by.get(40.0), by.get(0.0)
    t: dict[str, Any] = {}
    if far:
        t["grounded_lookup_at_40ms_vs_off >= 1.5"] = far["grounded"]["lookup"]["vs_off"]
        t["free_auto_at_40ms_vs_off >= 1.0"] = far["free"]["auto"]["vs_off"]
        t["four_users_auto_at_40ms_vs_off >= 1.0"] = far["four_users"]["auto_vs_off"]
    if near:
        t["auto_at_0ms_vs_off >= 0.95 (grounded, free)"] = [near["grounded"]["auto"]["vs_off"],
                                                           near["free"]["auto"]["vs_off"]]
    t["prediction_error_off (per delay) within 15%"] = {r["delay_ms"]: r["grounded"]["off"].get("prediction_error")
                                                       for r in rings}
    t[f"draft_model_at_{drafted['delay_ms']:g}ms_vs_off >= 3 (grounded, free)"] = [
        drafted["grounded"]["draft"]["vs_off"], drafted["free"]["draft"]["vs_off"]]
    t["another_vocabulary_refused"] = refusal
    t["every_reply_identical"] = all(not r[g][m]["different"] for r in [*rings, drafted]
                                     for g in ("grounded", "free") for m in r[g])
    return t


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kafila.bench.local_context import greedy_chat
    from kafila.bench.report import emit, envelope
    from kafila.model.embedded import default_model_path

    console = Console(stderr=True)
    delays = [float(d) for d in args.delays.split(",")]
    model = default_model_path()
    console.log("llama-cpp-python's own greedy replies (the ground truth)")
    truth = {name: greedy_chat(str(model), p, CONTEXT, 128, args.tokens)["reply"]
             for name, p in {**GROUNDED, **FREE}.items()}
    rings = []
    for i, delay in enumerate(delays):
        console.log(f"ring of three members, {delay:g} ms per link (EMULATION)")
        rings.append(_ring(delay, args.tokens, truth, fresh=i == 0))
    draft = Path(args.draft).resolve() if args.draft else model
    console.log(f"the same at {max(delays):g} ms, its head drafting with {draft.name}")
    drafted = _ring(max(delays), args.tokens, truth, False, ("off", "draft"), draft)
    refusal = _refusal(model)
    results = {"tokens": args.tokens, "rings": rings, "draft_ring": drafted, "refusal": refusal,
               "targets": _targets(rings, drafted, refusal)}
    emit(envelope("wan", results), args.json, args.out)
    if not args.json:
        out = Console()
        table = Table("delay", "prompts", "mode", "tok/s", "× off", "accepted/drafted", "tok/circuit",
                      "predicted / measured ms", "identical", title="single user, greedy (EMULATION: link delays)")
        for r in [*rings, drafted]:
            for group in ("grounded", "free"):
                for mode in r[group]:
                    m = r[group][mode]
                    table.add_row(f"{r['delay_ms']:g} ms", group, mode, f"{m['tokens_per_s']:.1f}",
                                  f"{m['vs_off']:.2f}×", f"{m['accepted']}/{m['drafted']}",
                                  f"{m['tokens_per_circuit']:.2f}",
                                  f"{m.get('predicted_s_per_token', 0) * 1e3:.1f} / "
                                  f"{m.get('measured_s_per_token', 0) * 1e3:.1f}",
                                  f"{len(m['identical'])}/{len(m['identical']) + len(m['different'])}")
        out.print(table)
        out.print(f"another vocabulary: {refusal or 'NOT refused'}")
        for r in rings:
            f = r["four_users"]
            share = f["compute_share"]["off"]
            out.print(f"{r['delay_ms']:g} ms, four users at once: {f['off']:.1f} tok/s off, {f['auto']:.1f} auto "
                      f"({f['auto_vs_off']:.2f}×); compute, which the shared cores serialize, "
                      f"{'?' if share is None else f'{share:.0%}'} of a circuit")
    return 0
