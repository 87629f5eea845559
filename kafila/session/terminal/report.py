"""Plain-terminal renderings of a session: the plan summary and a one-shot reply through the chat API."""

from __future__ import annotations

import asyncio
from typing import IO, Any

from rich.table import Table

from kafila.session.state import SessionState


def _figure(v: Any) -> str:
    """An emulated figure as announced: a number, or up/down (link_mbit)."""
    if isinstance(v, list):
        return "/".join(_figure(x) for x in v)
    return f"{v:g}" if isinstance(v, int | float) else str(v)


def plan_summary(state: SessionState) -> Table:
    """The admitted ring: order (head first), ranges, predicted stage times, the bottleneck, the baselines."""
    plan = state.plan or {}
    table = Table(title=f"ring {' → '.join(plan.get('order', []))} (head {plan.get('head')})", title_justify="left")
    for col in ("member", "blocks", "predicted ms/token", "memory", "emulated"):
        table.add_column(col)
    bottleneck = plan.get("bottleneck_seconds") or 0.0
    for name in plan.get("order", []):
        start, end = plan["ranges"][name]
        t = plan["stage_seconds"][name]
        mark = " ◀ bottleneck" if abs(t - bottleneck) < 1e-12 else ""
        emu = state.members.get(name)
        emulated = ", ".join(f"{k} {_figure(v)}" for k, v in (emu.emulated if emu else {}).items()) or "—"
        table.add_row(name, f"[{start}, {end})", f"{t * 1e3:.2f}{mark}", f"{plan['memory_bytes'][name] / 1e6:.0f} MB",
                      emulated)
    lines = [f"bottleneck {bottleneck * 1e3:.2f} ms, utilisation {plan.get('utilisation', 0):.0%}"]
    ttft = plan.get("ttft") or {}
    if ttft.get("seconds") is not None:
        lines.append(f"time to first token {ttft['seconds']:.2f} s predicted for {ttft['prompt_tokens']} prompt tokens")
    for name, base in (plan.get("baselines") or {}).items():
        if base.get("feasible"):
            ratio = base["bottleneck_seconds"] / bottleneck if bottleneck else float("nan")
            lines.append(f"{name}: bottleneck {base['bottleneck_seconds'] * 1e3:.2f} ms ({ratio:.2f}× Kafila's)")
        else:
            lines.append(f"{name}: cannot place the model ({base.get('reason')})")
    builds = plan.get("builds") or {}
    if builds.get("mode") == "mixed":
        differ = ", ".join(f"{n} ({'; '.join(d.split(':')[0] for d in ds)})" for n, ds in builds["differ"].items())
        lines.append(f"MIXED llama.cpp builds, not bit-exact: {differ} differ from the host's")
    elif builds:
        lines.append("exact: every member runs the host's llama.cpp build")
    table.caption = "; ".join(lines)
    table.caption_justify = "left"
    return table


def reply_via_api(url: str, prompt: str, max_tokens: int, temperature: float,
                  echo: IO[str] | None = None) -> tuple[str, dict[str, Any]]:
    """One chat message through the session's API (raw text completed when the model has no chat template);
    returns the reply text and its stats block."""
    from kafila.session.api.client import ApiClient, Notice, Progress, ReplyStats

    async def go() -> tuple[str, dict[str, Any]]:
        parts: list[str] = []
        stats: dict[str, Any] = {}
        async with ApiClient(url) as api:
            async for item in api.stream_reply([{"role": "user", "content": prompt}], max_tokens=max_tokens,
                                               temperature=temperature):
                if isinstance(item, ReplyStats):
                    stats = dict(item.raw or {})
                    continue
                if isinstance(item, Notice):
                    if echo is not None:
                        lead = "\n" if parts else ""  # a notice before any text needs no line break of its own
                        echo.write(f"{lead}[{item.text}]\n")
                    continue
                if isinstance(item, Progress):  # the echo holds the reply's text only
                    continue
                parts.append(item)
                if echo is not None:
                    echo.write(item)
                    echo.flush()
        return "".join(parts), stats

    return asyncio.run(go())
