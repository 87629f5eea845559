"""The planner's inputs read from files: a fleet JSON file, and a model JSON or GGUF file.

The planner's one door to files (the rest of it is pure): the JSON goes through kafila.planner.schema;
a GGUF file is described by the model layer, imported only then, so that JSON alone needs none of it.
Every failure is a PlanInputError naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kafila.errors import PlanInputError
from kafila.planner.schema import parse_fleet, parse_model
from kafila.planner.spec import Member, ModelSpec


def _read_json(path: str, what: str) -> Any:
    p = Path(path).expanduser()
    try:
        text = p.read_text()
    except OSError as exc:
        raise PlanInputError(f"{what} file {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanInputError(f"{what} file {path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None


def load_fleet(path: str) -> tuple[Member, ...]:
    """Members from a fleet JSON file."""
    return parse_fleet(_read_json(path, "fleet"))


def load_model(path: str | None) -> ModelSpec:
    """A model spec from a model JSON file, a GGUF file (through the model layer), or the embedded default."""
    if path is not None and path.lower().endswith(".json"):
        return parse_model(_read_json(path, "model"))
    try:
        from kafila.model.describe import describe_model
        from kafila.model.embedded import resolve_model
    except ImportError as exc:
        raise PlanInputError(f"reading GGUF files needs the model layer ({exc}); pass --model MODEL.json") from None
    return ModelSpec.described(describe_model(resolve_model(path)))
