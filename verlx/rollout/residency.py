"""What of an engine is on the GPU, whether its weights are complete, and which policy version they are: the one
record of an engine's state (RolloutEngine keeps it; nothing else does).

The cycle every step: release all → train → resume weights → push weights → flush cache → resume KV cache →
generate. Engines that discard weights on release (vLLM sleep level 2, SGLang without CPU backup) or start from
random weights (load_format=dummy) must receive every parameter before generating; this object remembers that and
refuses out-of-order calls with a message instead of letting the engine fail deep inside (or generate garbage).
"""

from __future__ import annotations

WEIGHTS = "weights"
KV_CACHE = "kv_cache"
#: wake order: weights first (they are pushed into), the KV cache last (it is the largest allocation)
WAKE_ORDER = (WEIGHTS, KV_CACHE)


class EngineStateError(RuntimeError):
    """An engine call arrived in a state where it cannot work (asleep, stale weights)."""


class EngineResidency:
    def __init__(self, engine: str, weights_current: bool, weights_survive_release: bool):
        self.engine = engine
        self.resident: set[str] = {WEIGHTS, KV_CACHE}
        self.weights_current = weights_current
        self.weights_survive_release = weights_survive_release
        #: the policy version of the weights (None: the engine's own, from disk or random, or a partial push)
        self.weights_version: int | None = None

    @property
    def asleep(self) -> bool:
        return not self.resident

    def mark_released(self) -> None:
        self.resident.clear()
        if not self.weights_survive_release:
            self.weights_current = False
            self.weights_version = None

    def to_resume(self, tags) -> list[str]:
        """The released tags among `tags`, in wake order; unknown tags are refused."""
        tags = list(tags)
        unknown = [t for t in tags if t not in WAKE_ORDER]
        if unknown:
            raise ValueError(f"{self.engine}: unknown wake-up tags {unknown}; known: {list(WAKE_ORDER)}")
        return [t for t in WAKE_ORDER if t in tags and t not in self.resident]

    def mark_resumed(self, tags) -> None:
        self.resident.update(tags)

    def require_weights_resident(self) -> None:
        if WEIGHTS not in self.resident:
            raise EngineStateError(
                f"{self.engine}: update_weights while the weights are released; call wake_up(['weights']) first"
            )

    def mark_pushed(self, complete: bool, version: int | None = None) -> None:
        """A push finished; `complete` says whether it covered every parameter, `version` which policy it was."""
        if complete:
            self.weights_current = True
        self.weights_version = version if complete else None

    def holds(self, version: int) -> bool:
        """Whether the engine's weights are this policy version, complete."""
        return self.weights_current and self.weights_version == version

    def require_ready_to_generate(self) -> None:
        missing = [t for t in WAKE_ORDER if t not in self.resident]
        if missing:
            raise EngineStateError(f"{self.engine}: generate while {missing} are released (the engine is asleep); "
                                   "call wake_up first")
        if not self.weights_current:
            raise EngineStateError(
                f"{self.engine}: generate before a complete weight push; the engine's weights are random "
                f"(load_format=dummy) or were discarded by sleep (sleep_level=2), so call update_weights with "
                f"every parameter first"
            )
