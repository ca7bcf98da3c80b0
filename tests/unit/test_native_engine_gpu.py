"""The native engine on a GPU: CUDA graphs agree with eager decode, sleep frees the memory, bf16 log-probs track HF,
the compiled triton kernels (decode backend, fused sampler) agree with their torch counterparts."""

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


@pytest.mark.parametrize(
    "meta", [dict(do_sample=False), dict(temperature=1.0, seed=3), dict(temperature=1.0, top_p=0.9, seed=3)]
)
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


def test_compiled_sampler_matches_torch_sampler():
    """The fused sampler compiled for this GPU draws the tokens sample_tokens draws (greedy, T = 1, T = 0.6,
    blocked stop ids), and its fused step leaves the slot buffers as the torch bookkeeping does."""
    pytest.importorskip("triton")
    from native_triton_sampling_check import check_fused_step, check_matches_reference

    check_matches_reference(torch.device("cuda"), torch.bfloat16, rows=64)
    check_fused_step(torch.device("cuda"), torch.bfloat16)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_compiled_sampler_draws_follow_softmax(temperature):
    """2^17 draws from the planted three-group vocabulary: chi-square below the p = 0.001 quantile, log-probs
    equal log_softmax(logits / T)."""
    pytest.importorskip("triton")
    from sampling_checks import CHI2_999, bin_probs, chi_square, plan, planted_row
    from verlx.rollout.native.triton_sampling import TritonSampler

    rows = 1 << 17
    logits = planted_row().to("cuda", torch.bfloat16).expand(rows, -1).contiguous()
    seeds = torch.randint(0, 2**32, (rows,), generator=torch.Generator().manual_seed(1)).cuda()
    steps = torch.arange(rows, device="cuda") % 17
    tokens, logprobs = TritonSampler(torch.device("cuda")).sample(logits, plan(temperature), None, seeds, steps)
    stat, dof = chi_square(tokens, bin_probs(temperature))
    assert stat < CHI2_999[dof], stat
    expected = torch.log_softmax(logits.float() * (1.0 / temperature), -1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_compiled_sampler_at_full_vocabulary_size():
    """Qwen2.5's vocabulary (151936 ids, 149 groups) in bf16, 256 rows: the same tokens as sample_tokens on the GPU
    (a group mass summed in another order can flip a near-tie, so one row of 256 may differ)."""
    pytest.importorskip("triton")
    from sampling_checks import plan
    from verlx.rollout.native.sampling import sample_tokens
    from verlx.rollout.native.triton_sampling import TritonSampler

    gen = torch.Generator(device="cuda").manual_seed(0)
    logits = (torch.randn(256, 151936, generator=gen, device="cuda") * 4).to(torch.bfloat16)
    seeds = torch.arange(256, device="cuda") * 2654435761 % 2**32
    steps = torch.arange(256, device="cuda")
    for case in (plan(greedy=True), plan(1.0), plan(0.7)):
        want, _ = sample_tokens(logits, case, None, seeds, steps)
        tokens, logprobs = TritonSampler(torch.device("cuda")).sample(logits, case, None, seeds, steps)
        assert (tokens != want).sum() <= (0 if case.greedy else 1), case
        expected = torch.log_softmax(logits.float() * (1.0 / case.temperature), -1).gather(1, tokens[:, None])
        torch.testing.assert_close(logprobs, expected.squeeze(1), atol=1e-4, rtol=0)


def test_triton_and_torch_samplers_generate_the_same(checkpoint):
    """Same engine (bf16, triton decode backend), sampler torch vs triton: same responses, through CUDA graphs,
    with stop ids, min_new_tokens and n = 2."""
    pytest.importorskip("triton")
    prompts = to_cuda(with_meta(ragged_prompts(8, 16, seed=5), n=2, temperature=0.8, min_new_tokens=3, seed=7))
    outs = {}
    for name in ("torch", "triton"):
        eng = engine(checkpoint, max_num_seqs=6, eos=(7, EOS), engine_kwargs={"native": {"sampler": name}})
        assert eng.sampler.name == name
        outs[name] = eng.generate(prompts)
    assert torch.equal(outs["torch"].batch["responses"], outs["triton"].batch["responses"])
    torch.testing.assert_close(outs["torch"].batch["rollout_log_probs"], outs["triton"].batch["rollout_log_probs"],
                               atol=1e-4, rtol=0)
