"""`canzona.net.free_port`: rendezvous ports outside the kernel's ephemeral range."""

from __future__ import annotations

import socket

from canzona.net import LOWEST, ephemeral_range, free_port


def test_a_free_port_binds_and_lies_below_the_ephemeral_range() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high < 65536
    ports = {free_port() for _ in range(20)}
    assert all(LOWEST <= p < low for p in ports), ports  # never one the kernel hands out by itself
    assert len(ports) > 1  # drawn, not a fixed port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports.pop()))


def test_a_taken_port_is_not_returned(monkeypatch) -> None:
    import canzona.net as net

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        draws = iter([port, port, port])
        monkeypatch.setattr(net.random.SystemRandom, "randrange", lambda self, a, b: next(draws, LOWEST + 7))
        monkeypatch.setattr(net, "ephemeral_range", lambda: (max(port + 1, LOWEST + 2000), 65000))
        assert net.free_port() != port
