"""Small networking helpers shared by the launchers, the calibration and the tests."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Rendezvous ports are drawn from [LOWEST, the kernel's ephemeral range): see `free_port`.
LOWEST = 10000
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_DRAWS = 64


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel hands out by itself (bind to port 0, every outgoing connection):
    Linux's ``ip_local_port_range``, or its default where it cannot be read."""
    try:
        low, high = map(int, EPHEMERAL_RANGE.read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _binds(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a rendezvous on this host (rank 0 binds it
    seconds later, once its process has started).

    Drawn at random below the kernel's ephemeral range: a port the kernel hands out itself can be
    handed out again in those seconds -- to another launch's ``bind(0)`` or to one of the hundreds
    of connections gloo opens -- and the rendezvous then fails with EADDRINUSE (seen with two
    test workers launching ranks at once). A random draw among about 22 000 ports is taken in
    between only by another caller drawing the same number. Falls back to the kernel's choice
    when no draw binds (or the ephemeral range leaves no room below it)."""
    low, _ = ephemeral_range()
    if low - LOWEST > 1000:
        draw = random.SystemRandom()
        for _ in range(_DRAWS):
            port = draw.randrange(LOWEST, low)
            if _binds(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
