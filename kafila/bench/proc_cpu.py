"""CPU seconds a process has used (user + system), read from /proc: a rate's cost that a busy machine disturbs less."""

from __future__ import annotations

import os


def cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of `pid` (this process by default); None where /proc cannot tell."""
    try:
        with open(f"/proc/{pid or os.getpid()}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # after the command's closing parenthesis: field 3 (state) is fields[0], so utime (14) and stime (15)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
