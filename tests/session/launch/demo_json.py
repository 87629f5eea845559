"""`kafila demo --prompt … --json` in a process of its own, on the tests' shared probe: its JSON document."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kafila.session.launch.demo import DemoOptions
from tests.conftest import REPO
from tests.shared_probe import shared_probe


def demo_json(cache: Path, prompt: str, tokens: int, *args: str) -> dict[str, Any]:
    """A greedy reply to `prompt` through a demo of three unslowed members (`args`: more demo options)."""
    shared_probe(cache, DemoOptions().member_threads())
    env = {**os.environ, "KAFILA_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, str(REPO / "kafila.py"), "demo", "--prompt", prompt, "--max-tokens",
                          str(tokens), "--temperature", "0", "--json", "--api-port", "0", "--throttle", "1,1,1", *args],
                         capture_output=True, text=True, env=env, timeout=800)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout))
