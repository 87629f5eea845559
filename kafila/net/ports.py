"""Finding free UDP ports for a rendezvous, which listens on a port P and on P+1."""

from __future__ import annotations

import socket

from kafila.errors import NetworkError


def free_udp_pair(ip: str = "127.0.0.1", alt_ip: str | None = None) -> int:
    """A port P such that UDP P and P+1 are free on `ip` (and on `alt_ip` when given)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((ip, 0))
            port = int(s.getsockname()[1])
        if port >= 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for host in [ip] + ([alt_ip] if alt_ip else []):
                for p in (port, port + 1):
                    t = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    socks.append(t)
                    t.bind((host, p))
            return port
        except OSError:
            continue
        finally:
            for t in socks:
                t.close()
    raise NetworkError(f"no free pair of UDP ports on {ip} for a rendezvous")
