"""SGLang mappings: ServerArgs fields, Engine arguments for a multi-node group, sampling params, outputs."""

from __future__ import annotations

import dataclasses

import msgspec
import pytest
from packaging.version import Version

from engine_fakes.contexts import make_ctx
from verlx.rollout.base import SamplingParams
from verlx.rollout.engine_layout import plan_engine_layout
from verlx.rollout.kernel_backends import KernelInventory
from verlx.rollout.sglang_adapter import (
    SGLangFeatures,
    build_server_args,
    parse_sglang_outputs,
    server_arg_names,
    sglang_sampling_params,
)
from verlx.rollout.token_io import EngineGenerationError


class StructArgs(msgspec.Struct, kw_only=True):
    model_path: str = ""
    tp_size: int = 1


@dataclasses.dataclass
class DataclassArgs:
    model_path: str = ""
    cuda_graph_max_bs: int = 0


def test_server_arg_names_by_release():
    assert server_arg_names(StructArgs, SGLangFeatures(Version("0.5.23"))) == {"model_path", "tp_size"}
    assert server_arg_names(DataclassArgs, SGLangFeatures(Version("0.5.19"))) == {"model_path", "cuda_graph_max_bs"}


def test_server_args_of_a_two_node_group(tmp_path):
    ctx = make_ctx(str(tmp_path), rank=8, world_size=16, tp_size=16, n_gpus_per_node=8, sleep_level=2,
                   max_model_len=4096, enable_chunked_prefill=False, enable_prefix_caching=False, enforce_eager=True)
    layout = plan_engine_layout(8, 16, 16, 8, 2)
    fields = {"model_path", "tp_size", "nnodes", "node_rank", "dist_init_addr", "base_gpu_id", "gpu_id_step",
              "enable_weights_cpu_backup", "context_length", "chunked_prefill_size", "disable_radix_cache",
              "disable_cuda_graph", "random_seed", "port", "nccl_port"}
    args = build_server_args(ctx, layout, frozenset(fields), base_gpu_id=0, dist_init_addr="10.0.0.1:30002",
                             weights_cpu_backup=False, kernels=KernelInventory(capability=None))
    assert args == dict(
        model_path=str(tmp_path), tp_size=16, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:30002", base_gpu_id=0,
        gpu_id_step=1, enable_weights_cpu_backup=False, context_length=4098, chunked_prefill_size=-1,
        disable_radix_cache=True, disable_cuda_graph=True, random_seed=5, port=30000, nccl_port=30001,
    )


@pytest.mark.parametrize(
    "params,expected",
    [
        (SamplingParams(n=4, temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=32, stop_token_ids=[2, 7]),
         dict(n=4, max_new_tokens=32, min_new_tokens=0, temperature=0.7, top_p=0.9, top_k=20, ignore_eos=False,
              stop_token_ids=[2, 7])),
        (SamplingParams(temperature=0.0, top_p=0.5, top_k=5, max_new_tokens=8, stop_token_ids=[2], seed=3),
         dict(n=1, max_new_tokens=8, min_new_tokens=0, temperature=0.0, top_p=1.0, top_k=-1, ignore_eos=False,
              stop_token_ids=[2])),
        (SamplingParams(temperature=1.0, top_k=0, max_new_tokens=8, min_new_tokens=3, ignore_eos=True,
                        stop_token_ids=[2], seed=11),
         dict(n=1, max_new_tokens=8, min_new_tokens=3, temperature=1.0, top_p=1.0, top_k=-1, ignore_eos=True,
              stop_token_ids=[])),
    ],
    ids=["sampling", "greedy", "ignore_eos_seed_topk0"],
)
def test_sampling_params(params, expected):
    """The step seed never becomes sampling_seed: SGLang's seeded sampler draws the same noise for the same
    (seed, position), so the n samples of a prompt would all be identical (every GRPO advantage 0)."""
    assert sglang_sampling_params(params) == {**expected, "no_stop_trim": True, "skip_special_tokens": False}


def output(ids, reason="stop", logprobs=True, **finish):
    meta = {"id": "x", "prompt_tokens": 3, "completion_tokens": len(ids), "cached_tokens": 0,
            "finish_reason": {"type": reason, **finish}}
    if logprobs:
        meta["output_token_logprobs"] = [(-0.5 * (i + 1), t, None) for i, t in enumerate(ids)]
    return {"text": "", "output_ids": ids, "meta_info": meta}


def test_parse_grouped_outputs():
    outs = [output([11, 2], matched=2), output([12, 13], "length"), output([14, 2], matched=2), output([2], matched=2)]
    result = parse_sglang_outputs(outs, 4, want_log_probs=True)
    assert [r.token_ids for r in result] == [[11, 2], [12, 13], [14, 2], [2]]
    assert [r.log_probs for r in result] == [[-0.5, -1.0], [-0.5, -1.0], [-0.5, -1.0], [-0.5]]
    assert [r.finish_reason for r in result] == ["stop", "length", "stop", "stop"]
    (single,) = parse_sglang_outputs(output([5], logprobs=False), 1, want_log_probs=False)
    assert single.token_ids == [5] and single.log_probs is None


def test_parse_errors():
    with pytest.raises(EngineGenerationError, match="2 outputs for 3 requested samples"):
        parse_sglang_outputs([output([1]), output([2])], 3, False)
    aborted = parse_sglang_outputs([output([1]), output([2], "abort", message="out of memory")], 2, True)[1]
    assert (aborted.token_ids, aborted.finish_reason, aborted.detail) == ([2], "abort", "out of memory")
    with pytest.raises(EngineGenerationError, match="no meta_info.output_token_logprobs"):
        parse_sglang_outputs([output([1], logprobs=False)], 1, True)
    trimmed = output([7, 8, 2])
    trimmed["output_ids"] = [7, 8]
    with pytest.raises(EngineGenerationError, match="output_token_logprobs name tokens"):
        parse_sglang_outputs([trimmed], 1, True)
