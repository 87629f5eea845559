"""`kafila models`: the models on this machine that `--model` can name, and whether Kafila can split each."""

from __future__ import annotations

import argparse
import json

HELP = "list the models on this machine (Ollama, Hugging Face cache, LM Studio, embedded) and which can be split"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print a JSON list")


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from kafila.model.describe import Assessment, assess_model
    from kafila.model.embedded import installed_models
    from kafila.model.stores import StoreRoots, list_models

    roots = StoreRoots.from_env()
    rows: list[tuple[str, str, str, Assessment]] = []
    for name, path in installed_models():
        rows.append((name, "embedded", str(path), assess_model(path)))
    for m in list_models(roots):
        a = assess_model(m.path) if not m.problem else Assessment("?", "?", 0, m.problem)
        rows.append((m.name, m.source, str(m.path), a))
    if args.json:
        print(json.dumps([
            {"name": name, "source": source, "path": path, "arch": a.arch, "quant": a.quant, "bytes": a.file_bytes,
             "splittable": not a.problem, "reason": a.problem}
            for name, source, path, a in rows], indent=2))
        return 0
    console = Console()
    if not rows:
        console.print(f"no models found (looked in {roots.ollama}, {roots.huggingface}, "
                      f"{', '.join(map(str, roots.lmstudio))})")
        return 0
    table = Table("name", "source", "architecture", "size", "quantisation", "split")
    for name, source, _, a in rows:
        table.add_row(name, source, a.arch, _size(a.file_bytes) if a.file_bytes else "", a.quant,
                      "[green]yes[/]" if not a.problem else f"[red]no[/]: {a.problem}")
    console.print(table)
    return 0
