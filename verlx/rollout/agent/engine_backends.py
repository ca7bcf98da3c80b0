"""The engine-specific backends of AGENT_BACKENDS (see backends.py). sglang and vllm are imported lazily.

SGLang and vLLM are reached through the engine objects' attributes set up by their RolloutEngine classes
(`_engine`/`tp`/`residency` of SGLangRolloutEngine, `_llm`/`residency` of VLLMRolloutEngine).
"""

from __future__ import annotations

from verlx.rollout.agent.backends import GenerationBackend, GenOutput, SteppedBackend
from verlx.rollout.native.sampling import row_seed
from verlx.rollout.token_io import EngineGenerationError


def _finish(ids: list[int], stop_ids: set[int]) -> str:
    return "stop" if ids and ids[-1] in stop_ids else "length"


class NativeBackend(SteppedBackend):
    """The native engine's RequestStream: requests join the running batch at the next decode round; a sample's
    next turn reuses its previous turn's KV (prefill of the tool results only) while that slot is parked."""

    def __init__(self, engine, params, want_log_probs):
        super().__init__(engine, params, want_log_probs)
        self.stream, self.base_seed = engine.open_stream(params)
        self.stop_ids = set(params.stop_token_ids)
        self._last: dict[int, str] = {}  # sample -> its previous request (whose KV the next turn reuses)

    def _seed(self, sample: int, turn: int) -> int:
        """Sample i*n+j's first turn gets the seed a batch generate gives row (i, j), so a single-turn agent loop
        draws exactly the tokens of a synchronous rollout; later turns derive theirs from it."""
        prompt, j = divmod(sample, self.params.n)
        seed = row_seed(row_seed(self.base_seed, prompt), j)
        return row_seed(seed, turn) if turn else seed

    def _submit(self, request_id, ids, max_new_tokens, key):
        reuse = self._last.get(key[0])
        self._last[key[0]] = request_id
        self.stream.submit(request_id, ids, max_new_tokens, self._seed(*key), reuse=reuse)

    def _step(self):
        return [(key, GenOutput(ids, lps if self.want_log_probs else None, _finish(ids, self.stop_ids)))
                for key, ids, lps in self.stream.step()]

    def _busy(self) -> bool:
        return self.stream.busy

    def _abort(self, request_ids: set[str]) -> None:
        self.stream.cancel(request_ids)

    def _close(self) -> None:
        if self.stream.busy:
            self.stream.cancel_unfinished()


class VLLMBackend(SteppedBackend):
    """`llm_engine.add_request` per request, `llm_engine.step()` per round (vLLM batches continuously).

    Tensor-parallel peers would each need the same requests in the same order; the agent loop's tools can
    finish in different orders on different ranks, so multi-turn with vllm needs tensor_model_parallel_size=1
    (checked with the config)."""

    def __init__(self, engine, params, want_log_probs):
        super().__init__(engine, params, want_log_probs)
        engine.residency.require_ready_to_generate()
        self.llm_engine = engine._llm.llm_engine
        self._live: set[str] = set()

    def _submit(self, request_id, ids, max_new_tokens, key):
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        from verlx.rollout.vllm_adapter import vllm_sampling_kwargs

        sampling = SamplingParams(**vllm_sampling_kwargs(self._sampling(max_new_tokens), self.want_log_probs))
        sampling.output_kind = RequestOutputKind.FINAL_ONLY
        self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=list(ids)), sampling)
        self._live.add(request_id)

    def _step(self):
        from verlx.rollout.vllm_adapter import parse_vllm_outputs

        done = []
        for output in self.llm_engine.step():
            if not getattr(output, "finished", False) or output.request_id not in self._live:
                continue
            self._live.discard(output.request_id)
            result = parse_vllm_outputs([output], 1, self.want_log_probs)
            lps = result.log_probs[0] if result.log_probs is not None else None
            done.append((output.request_id, GenOutput(result.token_ids[0], lps, result.finish_reasons[0])))
        return done

    def _busy(self) -> bool:
        return bool(self._live)

    def _abort(self, request_ids: set[str]) -> None:
        live = sorted(self._live & request_ids)
        if live:
            self.llm_engine.abort_request(live)
            self._live.difference_update(live)

    def _close(self) -> None:
        if self._live:
            self.llm_engine.abort_request(sorted(self._live))
            self._live.clear()


class SGLangBackend(GenerationBackend):
    """`Engine.async_generate` per request; the batch's coroutines run on the engine's own event loop (its
    tokenizer manager is bound to it) on the tensor-parallel leader, and the result goes to every peer."""

    def __init__(self, engine, params, want_log_probs):
        super().__init__(engine, params, want_log_probs)
        engine.residency.require_ready_to_generate()

    async def generate(self, ids, max_new_tokens, key) -> GenOutput:
        from verlx.rollout.sglang_adapter import parse_sglang_outputs, sglang_sampling_params

        out = await self.engine._engine.async_generate(
            input_ids=list(ids), sampling_params=sglang_sampling_params(self._sampling(max_new_tokens)),
            return_logprob=self.want_log_probs)
        result = parse_sglang_outputs(out, 1, self.want_log_probs)
        if len(result.token_ids[0]) > max_new_tokens:
            raise EngineGenerationError(f"sglang returned {len(result.token_ids[0])} tokens for max_new_tokens="
                                        f"{max_new_tokens}")
        lps = result.log_probs[0] if result.log_probs is not None else None
        return GenOutput(result.token_ids[0], lps, result.finish_reasons[0])

    def cut(self) -> None:
        """Cancelling a coroutine leaves its request running in SGLang's scheduler: abort every one (the samples
        still waiting are all being cancelled), as veRL's over-sampling did."""
        self.engine._engine.tokenizer_manager.abort_request(abort_all=True)

    def run(self, make_coro):
        return self.engine.tp.run_on_leader(lambda: self.engine._engine.loop.run_until_complete(make_coro()))
