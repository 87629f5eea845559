"""Two functions the tool-call tests through a live ring offer a model: each call's arguments are checked against
these schemas."""

from __future__ import annotations

from typing import Any

WEATHER: Any = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}}
ADD: Any = {"type": "function", "function": {
    "name": "add", "description": "Adds two whole numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
