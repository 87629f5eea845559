"""The user's settings file: `config.toml` in the platform's user config directory (KAFILA_CONFIG overrides).

    cache_max_gb = 5    # the cache's size cap: past it, the least recently used files no
                        # running session needs are removed (when a session starts, and by
                        # `kafila cache --prune`); absent: no cap

A missing file means the defaults; a malformed one is an error naming the file and the setting.
"""

from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from kafila.errors import KafilaError


@dataclass(frozen=True)
class Config:
    """Settings from the config file."""

    cache_max_bytes: int | None = None


def config_path() -> Path:
    """Where the settings file is (it need not exist)."""
    env = os.environ.get("KAFILA_CONFIG")
    if env:
        return Path(env)
    import platformdirs

    return Path(platformdirs.user_config_dir("kafila")) / "config.toml"


def load_config(path: Path | None = None) -> Config:
    """The settings, or the defaults when there is no file."""
    path = config_path() if path is None else path
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        return Config()
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise KafilaError(f"config file {path}: cannot read it ({exc})") from None
    unknown = sorted(set(data) - {"cache_max_gb"})
    if unknown:
        raise KafilaError(f"config file {path}: unknown setting {', '.join(unknown)} (known: cache_max_gb)")
    cap = data.get("cache_max_gb")
    if cap is None:
        return Config()
    if not isinstance(cap, int | float) or isinstance(cap, bool) or not math.isfinite(cap) or cap <= 0:
        raise KafilaError(f"config file {path}: cache_max_gb must be a positive number of gigabytes, not {cap!r}")
    return Config(cache_max_bytes=int(cap * 1e9))
