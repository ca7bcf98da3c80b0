"""The native engine on a GPU: CUDA graphs agree with eager decode, sleep frees the memory, bf16 log-probs track HF."""

from __future__ import annotations

import gc

import pytest
import torch

from native_models import EOS, hf_token_logprobs, ragged_prompts, rollout_context, save_tiny_model, with_meta
from verlx.protocol import DataProto
from verlx.rollout.native.engine import NativeEngine

pytestmark = pytest.mark.gpu


def to_cuda(prompts: DataProto) -> DataProto:
    return DataProto({k: v.cuda() for k, v in prompts.batch.items()}, prompts.non_tensor_batch, prompts.meta_info)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3")
    model, config = save_tiny_model("qwen3", path)
    return model, config, path


def engine(checkpoint, backend="auto", **overrides):
    _, config, path = checkpoint
    overrides.setdefault("engine_kwargs", {"native": {}})
    overrides["engine_kwargs"]["native"].setdefault("decode_backend", backend)
    ctx = rollout_context(path, config, **{"dtype": "bfloat16", **overrides})
    ctx.device = torch.device("cuda")
    return NativeEngine(ctx)


@pytest.mark.parametrize("meta", [dict(do_sample=False), dict(temperature=1.0, top_p=0.9, seed=3)])
def test_cuda_graphs_match_eager_decode(checkpoint, meta):
    model = checkpoint[0]
    stop = 7
    prompts = to_cuda(with_meta(ragged_prompts(12, 16, seed=9), n=2, **meta))
    graphs = engine(checkpoint, max_num_seqs=5, eos=(stop, EOS))
    eager = engine(checkpoint, max_num_seqs=5, eos=(stop, EOS), enforce_eager=True)
    a = graphs.generate(prompts)
    assert graphs.last_stats["graph_captures"] > 0
    b = eager.generate(prompts)
    for key in ("responses", "response_mask", "rollout_log_probs"):
        assert torch.equal(a.batch[key], b.batch[key]), key
    again = graphs.generate(prompts)
    assert graphs.last_stats["graph_captures"] == 0  # graphs are reused while the engine is awake
    assert torch.equal(again.batch["responses"], a.batch["responses"])
    # bf16 engine vs the float32 HF model on the same sequences: close, not equal
    mask = a.batch["response_mask"].cpu()
    diff = a.batch["rollout_log_probs"].cpu() - hf_token_logprobs(model, to_cpu(a), 1.0) * mask
    assert diff.abs().sum() / mask.sum() < 0.08


def to_cpu(batch: DataProto) -> DataProto:
    return DataProto({k: v.cpu() for k, v in batch.batch.items()}, batch.non_tensor_batch, batch.meta_info)


def test_sleep_frees_at_least_95_percent_and_wake_restores(checkpoint):
    gc.collect()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated()
    # 1024 slots × 528 positions × 512 bytes/token = 264 MiB of KV cache
    eng = engine(checkpoint, max_num_seqs=1024, response_length=512)
    prompts = to_cuda(with_meta(ragged_prompts(8, 16), do_sample=False, max_new_tokens=32))
    first = eng.generate(prompts).batch["responses"]
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    alloc0, free0 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    eng.sleep()
    alloc1, free1 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    assert alloc0 - alloc1 >= 0.95 * held
    assert free1 - free0 >= 0.95 * held
    eng.wake_up()
    assert torch.equal(eng.generate(prompts).batch["responses"], first)


@pytest.mark.parametrize("kind", ["qwen3", "mistral_window", "qwen2"])
def test_triton_kernels_match_torch_decode_step(kind):
    pytest.importorskip("triton")
    from native_triton_check import check

    check(kind, torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_each_decode_backend_tracks_transformers_log_probs(checkpoint, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    model = checkpoint[0]
    eng = engine(checkpoint, backend=backend, max_num_seqs=6)
    assert eng.decode_backend == backend  # the triton self-test passed
    out = eng.generate(to_cuda(with_meta(ragged_prompts(8, 16, seed=4), temperature=1.0, seed=2)))
    mask = out.batch["response_mask"].cpu()
    diff = out.batch["rollout_log_probs"].cpu() - hf_token_logprobs(model, to_cpu(out), 1.0) * mask
    assert diff.abs().sum() / mask.sum() < 0.08
