"""The request stream every rollout engine offers (the shape of nano-vllm's add_request / step): `submit` requests,
`step` until they finish, `cancel` what must stop now.

Batch generation and partial rollout (rollout/generation.py) and the agent loop (rollout/agent/driver.py) are
written once over it; an engine only says how a request reaches it, how a step advances it and how a request is
stopped. Every request generates with the stream's sampling settings and its own token budget.

A cancelled request is not lost: it comes back from a later `step` with the tokens it had generated and finish
reason `abort` (partial rollout continues it from there with new weights). `busy` stays true until every
submitted request has come back, so a caller that stops early drains with `cancel(); while busy: step()`.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from verlx.rollout.base import SamplingParams

#: finish reasons: a stop token, the request's token budget, cancelled (or aborted by the engine)
STOP, LENGTH, ABORT = "stop", "length", "abort"


@dataclass
class Finished:
    """A request that came back: its generated tokens (and their log-probs when the engine returns them)."""

    key: str
    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str
    #: the engine's words when it aborted the request itself (e.g. the prompt is too long)
    detail: str = ""

    @property
    def completed(self) -> bool:
        return self.finish_reason in (STOP, LENGTH)


@dataclass
class StreamLimits:
    """What every request must fit: its budget within rollout.response_length, prompt + budget within the
    engine's max_model_len."""

    response_length: int
    max_model_len: int


class RequestStream(abc.ABC):
    """One generation's connection to an engine. Subclasses implement `_submit`, `_step`, `_cancel` and `_busy`;
    the bookkeeping of which requests are out and the checks of each request are here."""

    #: the event loop an engine's requests live on (SGLang's tokenizer manager is bound to one): coroutines that
    #: drive the stream run on it. None: any loop.
    loop = None

    def __init__(self, params: SamplingParams, limits: StreamLimits, want_log_probs: bool):
        self.params, self.limits, self.want_log_probs = params, limits, want_log_probs
        #: the seed a generation's rows derive theirs from (set by RolloutEngine.open_stream)
        self.base_seed = 0
        #: the vision inputs (pixel_values, image_grid_thw) and the decoded images of requests with images, by key;
        #: only an engine that declares supports_image_input is given any (rollout/generation.py checks)
        self.vision_inputs: dict[str, dict] = {}
        self.images: dict[str, list] = {}
        self._out: set[str] = set()
        self._returned: list[Finished] = []

    # ------------------------------------------------------------------ the contract
    def submit(self, key: str, prompt_ids: list[int], max_new_tokens: int, seed: int,
               follows: str | None = None, vision: dict | None = None, images: list | None = None) -> None:
        """Queue one request. `seed`: its sampling seed (engines that draw from one generator of their own ignore
        it); `follows`: the key of an earlier request of the same conversation whose prompt and output
        `prompt_ids` extend (an engine may reuse that request's KV cache; a hint only); `vision` and `images`: the
        vision inputs and the decoded images of a prompt with images (`vision_inputs`, `images`)."""
        self._check(key, prompt_ids, max_new_tokens)
        self._keep_vision(key, vision, images)
        self._submit(key, list(prompt_ids), int(max_new_tokens), int(seed), follows)
        self._out.add(key)

    def submit_samples(self, keys: list[str], prompt_ids: list[int], max_new_tokens: int, seeds: list[int],
                       vision: dict | None = None, images: list | None = None) -> None:
        """The samples of one prompt, one request (key) each; engines that prefill a prompt once for all its
        samples (SGLang's parallel sampling) take them as one and return them together."""
        for key in keys:
            self._check(key, prompt_ids, max_new_tokens)
            self._keep_vision(key, vision, images)
        self._submit_samples(list(keys), list(prompt_ids), int(max_new_tokens), [int(s) for s in seeds])
        self._out.update(keys)

    def step(self) -> list[Finished]:
        """Advance the engine once; the requests that came back since the last step."""
        engine_side = self._out - {f.key for f in self._returned}
        out, self._returned = self._returned + (self._step() if engine_side else []), []
        self._out.difference_update(f.key for f in out)
        return out

    async def step_async(self) -> list[Finished]:
        """`step` from a coroutine running on `loop`: an engine whose requests are coroutines first waits for one
        of them without blocking the loop."""
        await self._progress()
        return self.step()

    def cancel(self, keys: Iterable[str] | None = None) -> None:
        """Stop these requests (None: all); each comes back from a later step with finish reason `abort` and the
        tokens generated so far. Keys already back (or never submitted) are ignored."""
        targets = set(self._out) if keys is None else set(keys) & self._out
        targets -= {f.key for f in self._returned}
        if targets:
            self._returned += self._cancel(targets)

    @property
    def busy(self) -> bool:
        """Whether a submitted request has not come back yet."""
        return bool(self._out)

    def report(self) -> dict:
        """What the engine reports about this generation (rounds, prefill and decode time...); may be empty."""
        return {}

    # ------------------------------------------------------------------ what an engine implements
    @abc.abstractmethod
    def _submit(self, key: str, prompt_ids: list[int], max_new_tokens: int, seed: int, follows: str | None) -> None:
        ...

    def _submit_samples(self, keys: list[str], prompt_ids: list[int], max_new_tokens: int, seeds: list[int]) -> None:
        for key, seed in zip(keys, seeds):
            self._submit(key, prompt_ids, max_new_tokens, seed, None)

    @abc.abstractmethod
    def _step(self) -> list[Finished]:
        ...

    @abc.abstractmethod
    def _cancel(self, keys: set[str]) -> list[Finished]:
        """Stop these requests in the engine; return those that stopped at once (the others come from _step)."""

    async def _progress(self) -> None:
        """Wait (on `loop`) until a request may have finished; engines driven by step calls need not."""

    def _keep_vision(self, key: str, vision: dict | None, images: list | None) -> None:
        if vision:
            self.vision_inputs[key] = vision
        if images:
            self.images[key] = images

    # ------------------------------------------------------------------ checks
    def _check(self, key: str, prompt_ids: list[int], max_new_tokens: int) -> None:
        if key in self._out:
            raise ValueError(f"request {key}: a request with this key is still out")
        limit, width = int(max_new_tokens), self.limits.response_length
        if not 1 <= limit <= width:
            raise ValueError(f"request {key}: max_new_tokens={limit} must be in [1, rollout.response_length={width}]")
        if not prompt_ids or len(prompt_ids) + limit > self.limits.max_model_len:
            raise ValueError(f"request {key}: {len(prompt_ids)} context tokens + max_new_tokens={limit} exceed the "
                             f"engine's max_model_len {self.limits.max_model_len}; raise rollout.max_model_len")
