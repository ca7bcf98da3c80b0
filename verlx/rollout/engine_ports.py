"""The first port of the rollout engines' port blocks (engine_layout.py), chosen once by the driver.

Every engine replica takes PORTS_PER_ENGINE ports from a base port. A fixed base (30000) made two runs on one host
collide: the second run's SGLang scheduler failed on "EADDRINUSE" for port 30001 (2026-11-26, 4 × H100, a GRPO run
beside a Megatron run). The driver now picks a base whose whole span is free on its own host, starting at a random
block so that runs started together do not pick the same one; VERLX_ROLLOUT_BASE_PORT fixes it (firewalls, or
clusters whose other nodes use ports the driver cannot see).
"""

from __future__ import annotations

import random
import socket
from collections.abc import Callable

from verlx.rollout.engine_layout import PORTS_PER_ENGINE

BASE_PORT_ENV = "VERLX_ROLLOUT_BASE_PORT"
#: the bases tried: blocks in [SEARCH_START, SEARCH_END), below Linux's default ephemeral range (32768-60999), where
#: the kernel hands out ports to outgoing connections at any time: a block found free there could be taken before
#: the engines bind it
SEARCH_START, SEARCH_END = 20000, 32768


def port_is_free(port: int) -> bool:
    """Nothing listens on `port` on any interface of this host (a bind succeeds)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def free_base_port(engines: int, rng: random.Random | None = None,
                   is_free: Callable[[int], bool] = port_is_free) -> int:
    """A base port such that the `engines` replicas' ports (PORTS_PER_ENGINE each) are all free here now."""
    span = max(engines, 1) * PORTS_PER_ENGINE
    bases = list(range(SEARCH_START, SEARCH_END - span + 1, span))
    start = (rng or random.SystemRandom()).randrange(len(bases))
    for base in bases[start:] + bases[:start]:
        if all(is_free(p) for p in range(base, base + span)):
            return base
    raise RuntimeError(f"no block of {span} free ports between {SEARCH_START} and {SEARCH_END} on this host "
                       f"for the rollout engines; set {BASE_PORT_ENV} to the first of {span} free ports")
