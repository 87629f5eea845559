"""Write the dashboard's SVG screenshots into docs/ from the recorded states in tests/tui/states.py.

    python -m tests.tui.screenshots [OUT_DIR]      # default: docs/

The chat screenshot streams a scripted reply through the real API server (tests/tui/scripted_api.py).
Paths and times are made machine-independent (HOME, TZ) so regenerating gives the same files.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from kafila.session.state import SessionState
from kafila.tui.app import KafilaApp
from tests.tui import states
from tests.tui.scripted_api import Script, start

SIZE = (100, 30)
REPO = Path(__file__).resolve().parents[2]

Prepare = Callable[[KafilaApp], Awaitable[None]]


async def shot(out: Path, name: str, state: SessionState, keys: tuple[str, ...] = (),
               prepare: Prepare | None = None) -> Path:
    """Render `state`, press `keys`, run `prepare`, and save docs/tui-NAME.svg."""
    app = KafilaApp(state)
    async with app.run_test(size=SIZE) as pilot:
        while not app.rendered:
            await pilot.pause(0.02)
        await pilot.press(*keys)
        if prepare is not None:
            await prepare(app)
        await pilot.pause(0.2)
        path = out / f"tui-{name}.svg"
        app.save_screenshot(filename=path.name, path=str(out))
    return path


async def main(out: Path) -> list[Path]:
    """Every screen, one file each."""
    out.mkdir(parents=True, exist_ok=True)
    written = [
        await shot(out, "members", states.measuring_state(), ("f1", "down", "down")),  # the emulated one
        await shot(out, "reachability", states.admitted_state(), ("f2",)),
        await shot(out, "plan", states.admitted_state(), ("f3",)),
        await shot(out, "admission-progress", states.delivering_state(), ("f4",)),
        await shot(out, "rejected", states.rejected_state()),
        await shot(out, "lost", states.lost_state()),
    ]
    script = Script(pieces=["A ring ", "splits ", "the model's ", "blocks ", "across ", "machines: ", "each ",
                            "runs its ", "range ", "and passes ", "the activations on."])
    state = states.admitted_state()
    script.stats = {"tokens_per_s": 31.2, "network_share": 0.14,
                    "stages": {n: {"predicted_s": s.predicted_s, "measured_s": s.measured_s}
                               for n, s in state.stages.items()}}
    server, url = await start(script)
    try:
        state.api_url = url

        async def chat(app: KafilaApp) -> None:
            from kafila.tui.widgets.chat import ChatPane

            pane = app.dashboard.query_one(ChatPane)
            for text in ("Explain the ring in one sentence.",):
                app.dashboard.query_one("#prompt").value = text  # type: ignore[attr-defined]
                await app.dashboard.query_one("#prompt").action_submit()  # type: ignore[attr-defined]
                while not pane.streaming:
                    await asyncio.sleep(0.01)
                while pane.streaming:
                    await asyncio.sleep(0.01)

        written.append(await shot(out, "chat", state, (), chat))
    finally:
        await server.stop()
    return written


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "docs"
    with tempfile.TemporaryDirectory() as home:
        os.environ["HOME"] = home  # shown as ~ in the screenshots
        os.environ["KAFILA_DATA_DIR"] = str(Path(home) / ".local" / "share" / "kafila")
        os.environ["TZ"] = "UTC"
        time.tzset()
        for p in asyncio.run(main(target)):
            print(p.relative_to(REPO) if p.is_relative_to(REPO) else p)
