"""free_port picks listening ports below the OS's ephemeral range, where no outgoing connection can take them
between the check and the rendezvous's bind (EADDRINUSE, seen in CI beside Ray's connections)."""

from __future__ import annotations

import socket

from verlx.utils import distributed
from verlx.utils.distributed import LISTEN_PORTS, free_port


def _ephemeral_range() -> range:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
    return range(low, high + 1)


def test_ports_come_from_below_the_ephemeral_range_and_can_be_bound():
    assert not set(LISTEN_PORTS) & set(_ephemeral_range())
    for _ in range(5):
        port = free_port()
        assert port in LISTEN_PORTS
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_taken_port_is_skipped_and_a_full_range_falls_back_to_the_os(monkeypatch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setattr(distributed, "LISTEN_PORTS", range(port, port + 1))
        other = free_port()
        assert other != port and other > 0
