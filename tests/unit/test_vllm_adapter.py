"""vLLM mappings: sampling parameters, RequestOutput parsing, loaded-name checks, LLM arguments; in server mode the
server's arguments, its requests' sampling_params and its answers (the JSON of vLLM 0.26.0's
/inference/v1/generate), and the weight handles its workers open."""

from __future__ import annotations

import pytest

from engine_fakes.contexts import make_ctx
from engine_fakes.fake_vllm import PACKED, CompletionOutput, Logprob, sampled_logprobs
from engine_fakes.fake_vllm import SamplingParams as FakeVLLMSamplingParams
from verlx.config.roles import EngineKwargs
from verlx.rollout.base import SamplingParams
from verlx.rollout.engine_layout import plan_engine_layout
from verlx.rollout.kernel_backends import KernelInventory
from verlx.rollout.token_io import EngineGenerationError
from verlx.rollout.vllm_adapter import (
    build_llm_args,
    build_server_args,
    completion_tokens,
    finish_of,
    parse_generate_response,
    server_sampling_params,
    takes_flat_logprobs,
    unloaded_names,
    vllm_sampling_kwargs,
)
from verlx.rollout.vllm_weight_receiver import EXTENSION, encode_bucket, open_bucket, tensor_handle


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


def test_flat_log_probs_are_asked_for_only_with_log_probs_and_where_the_release_has_them():
    params = SamplingParams(max_new_tokens=5)
    assert vllm_sampling_kwargs(params, True, flat_logprobs=True) == {**vllm_sampling_kwargs(params, True),
                                                                      "flat_logprobs": True}
    assert "flat_logprobs" not in vllm_sampling_kwargs(params, False, flat_logprobs=True)
    assert takes_flat_logprobs(FakeVLLMSamplingParams)  # a Struct listing the field, as vLLM 0.26.0's does

    class OlderRelease:  # a Struct without it (vLLM before December 2025)
        __struct_fields__ = ("n", "logprobs")

    assert not takes_flat_logprobs(OlderRelease)


def test_flat_log_probs_give_the_sampled_tokens_log_probs():
    flat = CompletionOutput(0, "", [5, 6, 7], None, sampled_logprobs([5, 6, 7], [-0.25, -0.5, -0.75], flat=True))
    assert completion_tokens(flat, True, "r", flat_logprobs=True) == ([5, 6, 7], [-0.25, -0.5, -0.75])
    assert completion_tokens(flat, False, "r", flat_logprobs=True) == ([5, 6, 7], None)
    shifted = CompletionOutput(0, "", [5, 6, 7], None, sampled_logprobs([6, 7, 8], [-0.25, -0.5, -0.75], flat=True))
    with pytest.raises(EngineGenerationError, match=r"request r: the log-probs name tokens \[6, 7, 8\]"):
        completion_tokens(shifted, True, "r", flat_logprobs=True)
    short = CompletionOutput(0, "", [5, 6, 7], None, sampled_logprobs([5, 6], [-0.25, -0.5], flat=True))
    with pytest.raises(EngineGenerationError, match="request r: 3 tokens but 2 log-prob entries"):
        completion_tokens(short, True, "r", flat_logprobs=True)


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


def test_server_arguments_are_the_in_process_ones_with_the_servers_own_workers(tmp_path):
    fields = ["model", "worker_extension_cls", "max_logprobs"]
    ctx = make_ctx(str(tmp_path), world_size=4, tp_size=2)
    in_process = build_llm_args(ctx, plan_engine_layout(0, 4, 2, 4, 1), fields, KernelInventory(capability=None))
    server = build_server_args(ctx, plan_engine_layout(0, 4, 2, 4, 1), fields, KernelInventory(capability=None),
                               "0.0.0.0", 31000, EXTENSION)
    assert server == {**in_process, "distributed_executor_backend": "mp", "host": "0.0.0.0", "port": 31000,
                      "worker_extension_cls": "verlx.rollout.vllm_weight_receiver.VLLMWeightReceiver"}
    single = build_server_args(make_ctx(str(tmp_path)), plan_engine_layout(0, 1, 1, 1, 1), fields,
                               KernelInventory(capability=None), "127.0.0.1", 31000, EXTENSION)
    assert single["distributed_executor_backend"] == "uni"  # in the server's engine process
    own = make_ctx(str(tmp_path), engine_kwargs=EngineKwargs(vllm={"worker_extension_cls": "my.Ext"}))
    with pytest.raises(ValueError, match=r"engine_kwargs.vllm.worker_extension_cls is set by verlx in server mode"):
        build_server_args(own, plan_engine_layout(0, 1, 1, 1, 1), fields, KernelInventory(capability=None),
                          "127.0.0.1", 31000, EXTENSION)


def test_server_requests_are_answered_once_with_every_token():
    params = SamplingParams(n=2, temperature=0.7, max_new_tokens=9, stop_token_ids=[2])
    assert server_sampling_params(params, True) == {**vllm_sampling_kwargs(params, True), "output_kind": 2}


def choice(index, ids, reason="length", names=None):
    names = [f"token_id:{t}" for t in ids] if names is None else names
    content = [{"token": name, "logprob": -0.5 * (k + 1), "bytes": None, "top_logprobs": []}
               for k, name in enumerate(names)]
    return {"index": index, "token_ids": ids, "finish_reason": reason, "logprobs": {"content": content}}


def test_a_generate_answer_gives_each_samples_tokens_and_log_probs_in_sample_order():
    answer = {"request_id": "generate-tokens-verlx-0-4",
              "choices": [choice(1, [7], "abort"), choice(0, [5, 2], "stop")]}
    assert parse_generate_response(answer, 2, True, "r") == [([5, 2], [-0.5, -1.0], "stop"), ([7], [-0.5], "abort")]
    assert parse_generate_response(answer, 2, False, "r") == [([5, 2], None, "stop"), ([7], None, "abort")]


def test_generate_answer_errors():
    with pytest.raises(EngineGenerationError, match=r"request r: choices \[0\] for 2 requested samples"):
        parse_generate_response({"choices": [choice(0, [5])]}, 2, True, "r")
    with pytest.raises(EngineGenerationError, match=r"request r sample 0: log-probs name tokens \['token_id:6'\] but "
                                                    r"the sampled tokens are \[5\]"):
        parse_generate_response({"choices": [choice(0, [5], names=["token_id:6"])]}, 1, True, "r")
    with pytest.raises(EngineGenerationError, match=r"log-probs name tokens None"):
        parse_generate_response({"choices": [{**choice(0, [5]), "logprobs": None}]}, 1, True, "r")


def test_weight_handles_open_on_the_workers_device():
    """CPU tensors travel by value (CUDA ones as CUDA-IPC handles keyed by GPU UUID: tests/gpu)."""
    import torch

    tensors = [("a", torch.arange(6.0).reshape(2, 3)), ("b", torch.ones(2, dtype=torch.bfloat16))]
    opened = open_bucket(encode_bucket([(name, tensor_handle(t)) for name, t in tensors]), torch.device("cpu"))
    assert [name for name, _ in opened] == ["a", "b"]
    for (_, sent), (_, got) in zip(tensors, opened):
        assert got.dtype == sent.dtype and torch.equal(got, sent)
    with pytest.raises(ValueError, match=r"weight a: no handle for this worker's device cpu \(the trainer sent handles "
                                         r"for \['GPU-1'\]\)"):
        open_bucket(encode_bucket([("a", {"GPU-1": ()})]), torch.device("cpu"))
