"""vLLM mappings: sampling parameters, RequestOutput parsing, loaded-name checks, LLM arguments."""

from __future__ import annotations

import pytest

from engine_fakes.contexts import make_ctx
from engine_fakes.fake_vllm import PACKED, CompletionOutput, Logprob
from verlx.config.roles import EngineKwargs
from verlx.rollout.base import SamplingParams
from verlx.rollout.engine_layout import plan_engine_layout
from verlx.rollout.kernel_backends import KernelInventory
from verlx.rollout.token_io import EngineGenerationError
from verlx.rollout.vllm_adapter import (
    build_llm_args,
    completion_tokens,
    finish_of,
    unloaded_names,
    vllm_sampling_kwargs,
)


@pytest.mark.parametrize(
    "params,want,expected",
    [
        (SamplingParams(n=3, temperature=0.6, top_p=0.95, top_k=40, max_new_tokens=100, stop_token_ids=[2], seed=9),
         True, dict(n=3, max_tokens=100, min_tokens=0, temperature=0.6, top_p=0.95, top_k=40, ignore_eos=False,
                    stop_token_ids=[2], logprobs=0)),
        (SamplingParams(temperature=0.0, top_p=0.3, top_k=3, max_new_tokens=7, stop_token_ids=[2, 5], seed=1),
         False, dict(n=1, max_tokens=7, min_tokens=0, temperature=0.0, top_p=1.0, top_k=-1, ignore_eos=False,
                     stop_token_ids=[2, 5], logprobs=None)),
        (SamplingParams(temperature=1.0, top_k=0, max_new_tokens=512, min_new_tokens=4, ignore_eos=True,
                        stop_token_ids=[2]),
         True, dict(n=1, max_tokens=512, min_tokens=4, temperature=1.0, top_p=1.0, top_k=-1, ignore_eos=True,
                    stop_token_ids=[], logprobs=0)),
    ],
    ids=["sampling_seeded", "greedy", "ignore_eos"],
)
def test_sampling_kwargs(params, want, expected):
    """No per-request seed: vLLM samples seeded requests one by one in Python with their own generators, and
    gives the prompts of a batch correlated noise (children get seed + index); the engine's own seed (per replica)
    keeps tensor-parallel peers in step."""
    assert vllm_sampling_kwargs(params, want) == {**expected, "detokenize": False}


def completion(index, ids, reason="stop", logprobs=True, stop_reason=None):
    lps = None
    if logprobs:  # the sampled token plus one more entry, as with logprobs=1
        lps = [{t: Logprob(-0.25 * (k + 1), 1, None), 99: Logprob(-9.0, 2, None)} for k, t in enumerate(ids)]
    return CompletionOutput(index, "", ids, None, lps, reason, stop_reason)


def test_a_completion_gives_its_tokens_and_the_sampled_tokens_log_probs():
    assert completion_tokens(completion(0, [5, 6]), True, "r") == ([5, 6], [-0.25, -0.5])
    assert completion_tokens(completion(0, [9, 10, 11], "length"), False, "r") == ([9, 10, 11], None)
    assert finish_of(completion(0, [5], "abort", stop_reason="oom")) == ("abort", "oom")
    assert finish_of(completion(0, [5, 2])) == ("stop", "")


def test_completion_errors():
    with pytest.raises(EngineGenerationError, match="request r: 2 tokens but none log-prob entries"):
        completion_tokens(completion(0, [5, 6], logprobs=False), True, "r")
    missing = completion(0, [5, 6])
    missing.logprobs[1] = {99: Logprob(-1.0)}
    with pytest.raises(EngineGenerationError, match="no log-prob for sampled token 6"):
        completion_tokens(missing, True, "r")


def test_unloaded_names_understand_fused_parameters():
    loaded = {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight", "model.norm.weight"}
    sent = ["model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight",
            "model.layers.0.self_attn.o_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    assert unloaded_names(sent, loaded, PACKED) == [
        "model.layers.0.self_attn.o_proj.weight", "model.layers.1.self_attn.q_proj.weight"
    ]
    assert unloaded_names(["model.layers.0.self_attn.k_proj.weight"], loaded, {}) == [
        "model.layers.0.self_attn.k_proj.weight"
    ]


def test_user_engine_kwargs_pass_through(tmp_path):
    ctx = make_ctx(str(tmp_path), engine_kwargs=EngineKwargs(vllm={"max_logprobs": 1, "enforce_eager": True,
                                                                    "sleep_mode_offload_cudagraph": None}))
    args = build_llm_args(ctx, plan_engine_layout(0, 1, 1, 1, 1), ["max_logprobs", "enforce_eager"],
                          KernelInventory(capability=None))
    assert args["max_logprobs"] == 1 and args["enforce_eager"] is True
    assert "sleep_mode_offload_cudagraph" not in args  # None means "leave vLLM's default"
