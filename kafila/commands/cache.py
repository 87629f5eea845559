"""`kafila cache`: what the user cache directory holds (stages, deliveries, probes, logs), and pruning it."""

from __future__ import annotations

import argparse
import json
import time

HELP = "list the cache (stages, deliveries, probes, logs) with sizes and ages; --prune what no session needs"


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prune", action="store_true",
                   help="remove what no running session needs (fresh probes stay), then apply the config's cap")
    p.add_argument("--json", action="store_true", help="print the listing as JSON")


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def run(args: argparse.Namespace) -> int:
    from kafila.config import load_config
    from kafila.model.stage_cache import default_cache_root
    from kafila.session.delivery.cache_inventory import enforce_cap, inventory, prune

    root = default_cache_root()
    cap = load_config().cache_max_bytes
    removed = []
    if args.prune:
        removed = prune(root)
        if cap is not None:
            removed += enforce_cap(root, cap)
    now = time.time()
    entries = inventory(root)
    total = sum(e.size for e in entries)
    if args.json:
        print(json.dumps({
            "root": str(root), "total_bytes": total, "cap_bytes": cap,
            "entries": [{"kind": e.kind, "path": str(e.path), "bytes": e.size, "age_s": round(e.age_s(now), 1),
                         "in_use": e.in_use} for e in entries],
            "removed": [{"kind": e.kind, "path": str(e.path), "bytes": e.size} for e in removed],
        }, indent=2))
        return 0
    if removed:
        print(f"removed {len(removed)} files, {sum(e.size for e in removed) / 1e6:.1f} MB")
    print(f"{root}: {len(entries)} files, {total / 1e6:.1f} MB"
          + (f" (cap {cap / 1e9:g} GB)" if cap is not None else ""))
    for e in entries:
        print(f"  {e.kind:<8} {e.size / 1e6:9.1f} MB  {_age(e.age_s(now)):>6} old  "
              f"{'in use  ' if e.in_use else '        '}{e.path.relative_to(root)}")
    return 0
