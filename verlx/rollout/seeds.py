"""The seeds of a generation's requests, derived the same way whatever the engine: a row's seed is a pure function
of the generation's base seed and the row's keys (prompt, sample, turn), so a request gets the same seed in a batch,
in a partial rollout and in an agent loop. Engines that draw from per-request seeds (native) reproduce a row's tokens
exactly; those that draw from one generator of their own (SGLang, vLLM) ignore them."""

from __future__ import annotations

_MASK32 = 0xFFFFFFFF


def _hash32_int(x: int) -> int:
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_seed(base: int, *keys: int) -> int:
    """Host-side derivation of a row's 32-bit seed from a base seed and its (prompt, sample) keys."""
    h = _hash32_int(base ^ (base >> 32))
    for k in keys:
        h = _hash32_int(h ^ _hash32_int(k + 0x9E3779B9))
    return h


def batch_row_seeds(base: int, n: int, rows: int, per_prompt: list | None = None) -> list[int]:
    """Row (prompt i, sample j) of a batch generation -> its seed: from per_prompt[i] when given (independent of the
    batch), else from the generation's base seed."""
    prompt_seeds = [int(per_prompt[i]) if per_prompt is not None else row_seed(base, i) for i in range(rows)]
    return [row_seed(s, j) for s in prompt_seeds for j in range(n)]


def turn_seed(base: int, sample: int, n: int, turn: int) -> int:
    """An agent loop's request: sample i*n+j's first turn gets the seed batch generation gives row (i, j), so a
    single-turn agent loop draws exactly the tokens of a synchronous rollout; later turns derive theirs from it."""
    prompt, j = divmod(sample, n)
    seed = row_seed(row_seed(base, prompt), j)
    return row_seed(seed, turn) if turn else seed
