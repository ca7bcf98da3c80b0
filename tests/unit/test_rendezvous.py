"""Rank 0 of a worker group holds its rendezvous port from the moment it names it (a port found free and bound later,
when the model is loaded, was taken in between on a busy host: EADDRINUSE in CI on 2026-11-26)."""

from __future__ import annotations

import errno
import socket

import pytest

from verlx.utils import distributed


def test_the_named_port_is_listening_at_once_and_cannot_be_taken(monkeypatch):
    monkeypatch.setattr(distributed, "_hosted_store", None)
    port = distributed.host_rendezvous()
    with socket.socket() as other, pytest.raises(OSError) as info:
        other.bind(("0.0.0.0", port))
    assert info.value.errno == errno.EADDRINUSE
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the store answers: the group's other ranks can connect whenever they come

