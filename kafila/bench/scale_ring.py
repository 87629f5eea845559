"""The demo ring on one file, watched from outside: when each stage was cut and delivered, memory, TTFT, decode.

Everything is read from the session's state as the host updates it and from the API's replies,
so the figures follow whatever the ring does when the benchmark runs.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafila.bench.replies import chat
from kafila.session.state import SessionState


@dataclass
class DeliveryClock:
    """A state listener: when the host began the epoch's stages, offered each one, and finished sending it.

    A member's cut time runs from the previous offer (or the start of delivery) to its own offer:
    the host cuts and hashes the stage in between. Its delivery runs from its offer to the host's
    last byte of it (sent; at most the link's send buffer is then still in flight), and `loaded_s`
    from its offer to the member's word that it holds, verified and loaded the stage."""

    started: float | None = None
    offered: dict[str, float] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)
    size: dict[str, int] = field(default_factory=dict)
    loaded: dict[str, float] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    last: float = 0.0

    def __call__(self, state: SessionState) -> None:
        now = time.perf_counter()
        if state.phase == "delivering" and self.started is None:
            self.started = now
        for name, (sent, total) in list(state.delivery.items()):
            self.offered.setdefault(name, now)
            self.size[name] = total
            self.sent[name] = sent
            self.last = now
            if sent >= total and name not in self.done:
                self.done[name] = now
            member = state.members.get(name)
            if member is not None and member.status == "loaded" and name not in self.loaded:
                self.loaded[name] = now

    def delivering(self, name: str) -> bool:
        return name in self.offered and name not in self.done

    def any_delivering(self) -> bool:
        return len(self.done) < len(self.offered)

    def report(self) -> dict[str, dict[str, float | None]]:
        """Per member: bytes, cut_s, delivery_s, mb_per_s (in the order the host offered the stages)."""
        out: dict[str, dict[str, float | None]] = {}
        before = self.started
        for name, at in sorted(self.offered.items(), key=lambda kv: kv[1]):
            cut = at - before if before is not None else 0.0
            before = at
            if name not in self.done:
                continue
            seconds = self.done[name] - at
            out[name] = {"bytes": self.size[name], "cut_s": cut, "delivery_s": seconds,
                         "mb_per_s": self.size[name] / seconds / 1e6 if seconds > 0 else 0.0,
                         "loaded_s": self.loaded[name] - at if name in self.loaded else None}
        return out

    def incomplete(self) -> dict[str, dict[str, float]]:
        """Stages the host had not finished sending when the session ended: bytes sent of how many, in how long."""
        return {n: {"bytes_sent": self.sent[n], "bytes": self.size[n], "seconds": self.last - at}
                for n, at in self.offered.items() if n not in self.done}

    def span(self) -> dict[str, float] | None:
        """All stages together: bytes over the time from the first offer to the last byte."""
        if not self.done or len(self.done) < len(self.offered):
            return None
        seconds = max(self.done.values()) - min(self.offered.values())
        total = sum(self.size.values())
        return {"bytes": total, "seconds": seconds, "mb_per_s": total / seconds / 1e6 if seconds > 0 else 0.0}


async def _completion(url: str, prompt: str, max_tokens: int) -> tuple[float, dict[str, Any]]:
    """Greedy completion of `prompt`; (seconds until the reply ended, its final stats)."""
    from kafila.session.api.client import ApiClient, ReplyStats

    stats: dict[str, Any] = {}
    t0 = time.perf_counter()
    async with ApiClient(url, read_timeout=3600) as api:
        async for item in api.stream_completion(prompt, max_tokens=max_tokens, temperature=0):
            if isinstance(item, ReplyStats):
                stats = dict(item.raw)
    return time.perf_counter() - t0, stats


def ttft(url: str, prompt: str, reply_tokens: int) -> dict[str, Any]:
    """Time to first token of `prompt` as a chat through the ring, and its greedy reply of `reply_tokens`."""
    try:
        r = asyncio.run(chat(url, prompt, reply_tokens, read_timeout=3600))
    except Exception as exc:  # a failed long prompt is a result to report, not the end of the benchmark
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    if r.first_text_s is None:
        return {"ok": False, "error": "the reply had no text", "stats": r.stats}
    return {"ok": True, "ttft_s": r.first_text_s, "prompt_tokens": r.stats.get("prompt_tokens"), "reply": r.text,
            "reply_tokens": r.stats.get("completion_tokens"), "stats": r.stats}


def decode(url: str, tokens: int, local: Any, rounds: int) -> dict[str, Any]:
    """The ring's greedy decode against one local context's (`local`, a LocalDecoder), `rounds` times each,
    alternating: the median gap between the ring's tokens of each reply of `tokens` tokens, the local median step,
    and their ratio (the median over rounds of each round's: the two halves of a round are seconds apart)."""
    asyncio.run(_completion(url, "Once upon a time", 4))  # warm-up
    out: dict[str, Any] = {"rounds": []}
    for _ in range(rounds):
        _, stats = asyncio.run(_completion(url, "Once upon a time", tokens))
        ring_ms, local_ms = stats.get("token_interval_median_ms"), local.ms_per_token(tokens)
        out["rounds"].append({"ring_ms": ring_ms, "local_ms": local_ms,
                              "completion_tokens": stats.get("completion_tokens")})
        out["stages"] = stats.get("stages") or {}
    timed = [r for r in out["rounds"] if r["ring_ms"]]  # a reply without stats has no ring figure
    out["ms_per_token"] = statistics.median(r["ring_ms"] for r in timed) if timed else None
    out["local_ms_per_token"] = statistics.median(r["local_ms"] for r in out["rounds"])
    out["vs_local"] = statistics.median(r["local_ms"] / r["ring_ms"] for r in timed) if timed else None
    out["completion_tokens"] = min(r["completion_tokens"] or 0 for r in out["rounds"])
    return out


def stage_errors(stages: dict[str, Any], alone_ms: dict[str, float]) -> dict[str, dict[str, float]]:
    """Predicted against measured stage time of every stage that has both, and against the same stage
    measured alone (`alone_ms`, the pipe floor's, minutes later): when both errors are large the machine's
    speed changed since the probe; when only the ring's is, the ring slowed its stages."""
    out = {}
    for name, s in stages.items():
        p, m = s.get("predicted_s"), s.get("measured_s")
        if p and m:
            out[name] = {"predicted_ms": p * 1e3, "measured_ms": m * 1e3, "error": abs(p - m) / m}
            if alone_ms.get(name):
                a = alone_ms[name]
                out[name] |= {"alone_ms": a, "alone_error": abs(p * 1e3 - a) / a}
    return out


def head_ttft(ttft: dict[str, Any]) -> float | None:
    """The TTFT the head measured: from the prompt's arrival there, the interval the plan predicts (and the
    dashboard shows beside it). The client's `ttft_s` adds the API's hop to the head and back."""
    return ((ttft.get("stats") or {}).get("ttft") or {}).get("measured_s")


def predicted_ttft(plan: dict[str, Any], prompt_tokens: int | None) -> float | None:
    """The plan's predicted time to first token for a prompt of `prompt_tokens` (None: it predicts none)."""
    from kafila.planner.ttft import predicted_ttft as predict

    return predict(plan, prompt_tokens) if prompt_tokens else None


def stage_prefill(plan: dict[str, Any], prompt_tokens: int | None) -> dict[str, tuple[float, float]]:
    """The plan's prefill seconds of each stage for the prompt, (as slowed, compute alone); empty without a model."""
    from kafila.planner.ttft import plan_model

    if not prompt_tokens:
        return {}
    model = plan_model(plan)
    return model.stage_prefill(prompt_tokens) if model else {}


def session(model: Path, members: tuple[Any, ...], context: int, cache_dir: Path, threads: int) -> Any:
    """A SessionThread running the demo ring on `model`."""
    from kafila.session.launch.demo import DemoOptions, run_demo
    from kafila.session.terminal.background import SessionThread

    opts = DemoOptions(model=model, members=members, api_port=0, context=context, cache_dir=cache_dir,
                       threads=threads, concurrency=1)
    return SessionThread(lambda state: run_demo(opts, state))
