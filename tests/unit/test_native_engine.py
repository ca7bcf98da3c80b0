"""The native engine end to end on CPU (float32) against transformers generate / forward."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from native_models import (
    EOS,
    PAD,
    hf_greedy,
    hf_token_logprobs,
    ragged_prompts,
    rollout_context,
    save_tiny_model,
    with_meta,
)
from verlx.protocol import DataProto
from verlx.rollout.base import ROLLOUT_ENGINES
from verlx.rollout.native.engine import NativeEngine

NEW = 32


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen2")
    model, config = save_tiny_model("qwen2", path)
    return model, config, path


def make_engine(qwen2, **overrides):
    _, config, path = qwen2
    return NativeEngine(rollout_context(path, config, **overrides))


def test_registered_as_native():
    assert ROLLOUT_ENGINES.get("native") is NativeEngine and NativeEngine.is_available()


@pytest.mark.parametrize("kv_len_block", [128, 8])
def test_greedy_equals_transformers_generate_token_for_token(qwen2, kv_len_block):
    """kv_len_block=8 makes decode attention run over 8-position KV buckets, switching every 8 steps."""
    model = qwen2[0]
    prompts = ragged_prompts(8, 16)
    engine = make_engine(qwen2, engine_kwargs={"native": {"kv_len_block": kv_len_block}})
    out = engine.generate(with_meta(prompts, do_sample=False, min_new_tokens=NEW))
    expected = hf_greedy(model, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS)
    assert torch.equal(out.batch["responses"], expected)
    assert torch.equal(out.batch["response_mask"], torch.ones(8, NEW, dtype=torch.long))
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"])
    # log-probs catch what argmax can hide (e.g. one step attending over one key too few)
    torch.testing.assert_close(out.batch["rollout_log_probs"], hf_token_logprobs(model, out, 1.0), atol=1e-4, rtol=0)


@pytest.mark.parametrize("kind", ["qwen3", "llama3", "mistral_window"])
def test_greedy_parity_other_architectures(kind, tmp_path):
    model, config = save_tiny_model(kind, tmp_path)
    prompts = ragged_prompts(4, 12, seed=3)
    engine = NativeEngine(rollout_context(tmp_path, config))
    out = engine.generate(with_meta(prompts, do_sample=False, min_new_tokens=NEW))
    assert torch.equal(out.batch["responses"], hf_greedy(model, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS))


def test_sampled_log_probs_match_transformers_forward(qwen2):
    model = qwen2[0]
    prompts = ragged_prompts(6, 16, seed=1)
    engine = make_engine(qwen2)
    for meta in (dict(temperature=0.7, top_p=0.9, top_k=20), dict(temperature=1.3), dict(do_sample=False)):
        out = engine.generate(with_meta(prompts, **meta, seed=5))
        temperature = meta.get("temperature", 1.0)
        expected = hf_token_logprobs(model, out, temperature) * out.batch["response_mask"]
        torch.testing.assert_close(out.batch["rollout_log_probs"], expected, atol=1e-4, rtol=0)
        assert out.batch["response_mask"].sum() > 6  # some tokens were generated


def test_stop_tokens_and_min_new_tokens_behave_like_transformers(qwen2):
    """Pick as stop id a token the greedy continuation of row 0 emits at step k; rows stop right after it
    (response includes it, then PAD, mask 0), and min_new_tokens=k+1 forbids it until then, like HF."""
    model = qwen2[0]
    prompts = ragged_prompts(8, 16, seed=2)
    free_run = hf_greedy(model, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS)
    k = 4
    stop = int(free_run[0, k])
    first = (free_run[0] == stop).nonzero()[0].item()
    for min_new in (0, first + 1):
        engine = make_engine(qwen2, eos=(stop,))
        out = engine.generate(with_meta(prompts, do_sample=False, min_new_tokens=min_new))
        expected = hf_greedy(model, prompts, NEW, min_new_tokens=min_new, eos_token_id=stop)
        assert torch.equal(out.batch["responses"], expected)
        lengths = out.batch["response_mask"].sum(-1)
        for row in range(8):
            ends = (expected[row] == stop).nonzero()
            want = ends[0].item() + 1 if len(ends) else NEW
            assert lengths[row].item() == want
            assert torch.all(out.batch["responses"][row, want:] == PAD)
        if min_new == 0:
            assert lengths[0].item() == first + 1
        else:
            assert lengths.min().item() > min_new  # no stop within the first min_new tokens


def test_ignore_eos_generates_max_new_tokens(qwen2):
    prompts = ragged_prompts(4, 16, seed=2)
    model = qwen2[0]
    stop = int(hf_greedy(model, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS)[0, 2])
    out = make_engine(qwen2, eos=(stop,)).generate(with_meta(prompts, do_sample=False, ignore_eos=True))
    assert torch.equal(out.batch["response_mask"], torch.ones(4, NEW, dtype=torch.long))


def test_n_samples_layout_and_seed_determinism(qwen2):
    prompts = ragged_prompts(3, 16, seed=4)
    engine = make_engine(qwen2)
    meta = dict(n=4, temperature=1.0, seed=11, max_new_tokens=12)
    out = engine.generate(with_meta(prompts, **meta))
    assert out.batch["responses"].shape == (12, NEW)
    # rows are p0s0..p0s3, p1s0..: each prompt repeated 4 times in a row
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(4, dim=0))
    responses = out.batch["responses"][:, :12]
    assert len({tuple(r.tolist()) for r in responses[:4]}) > 1  # the 4 samples of prompt 0 differ
    assert torch.equal(engine.generate(with_meta(prompts, **meta)).batch["responses"], out.batch["responses"])


def test_per_prompt_seeds_do_not_depend_on_batch_composition(qwen2):
    prompts = ragged_prompts(6, 16, seed=5)
    prompts.non_tensor_batch["seed"] = np.array([100, 101, 102, 103, 104, 105], dtype=object)
    engine = make_engine(qwen2, max_num_seqs=4)
    full = engine.generate(with_meta(prompts, n=2, temperature=1.0))
    order = [4, 1, 5]
    subset = prompts[order]
    alone = engine.generate(with_meta(subset, n=2, temperature=1.0))
    rows = [2 * i + j for i in order for j in range(2)]
    assert torch.equal(alone.batch["responses"], full.batch["responses"][rows])


def test_continuous_batching_equals_one_at_a_time(qwen2):
    """10 prompts × 2 samples through 3 slots, with a stop token making lengths differ (refill and compaction
    both run), give the same greedy outputs as generating each prompt alone."""
    model = qwen2[0]
    prompts = ragged_prompts(10, 16, seed=7)
    free_run = hf_greedy(model, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS)
    stop = int(free_run[1, 3])
    meta = dict(do_sample=False, n=2)
    engine = make_engine(qwen2, max_num_seqs=3, eos=(stop,))
    batched = engine.generate(with_meta(prompts, **meta))
    stats = engine.last_stats
    assert stats["compactions"] >= 1 and stats["rounds"] > 3
    single = make_engine(qwen2, max_num_seqs=1, eos=(stop,))
    for i in range(10):
        alone = single.generate(with_meta(prompts[[i]], **meta))
        assert torch.equal(alone.batch["responses"], batched.batch["responses"][2 * i : 2 * i + 2])
    lengths = batched.batch["response_mask"].sum(-1)
    assert lengths.min() < NEW and lengths.max() == NEW  # ragged, so slots really were refilled


def test_update_weights_switches_to_the_new_model(qwen2, tmp_path):
    other, _ = save_tiny_model("qwen2", tmp_path, seed=123)
    prompts = ragged_prompts(4, 16, seed=7)
    meta = dict(do_sample=False, min_new_tokens=NEW)
    engine = make_engine(qwen2)
    before = engine.generate(with_meta(prompts, **meta)).batch["responses"]
    # bucket by bucket, in float64 on purpose: the engine casts on copy
    items = [(k, v.double()) for k, v in other.state_dict().items()]
    engine.update_weights(iter(items[:10]))
    engine.update_weights(iter(items[10:]))
    after = engine.generate(with_meta(prompts, **meta)).batch["responses"]
    assert torch.equal(after, hf_greedy(other, prompts, NEW, min_new_tokens=NEW, eos_token_id=EOS))
    assert not torch.equal(after, before)
    with pytest.raises(KeyError, match="unknown weight 'model.layers.9.mlp.up_proj.weight'"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(112, 64))])
    with pytest.raises(ValueError, match=r"model.norm.weight' has shape \(65,\), expected \(64,\)"):
        engine.update_weights([("model.norm.weight", torch.zeros(65))])


def test_sleep_frees_state_and_wake_up_restores_it(qwen2):
    model = qwen2[0]
    prompts = ragged_prompts(4, 16, seed=8)
    meta = dict(do_sample=False, min_new_tokens=NEW)
    engine = make_engine(qwen2, sleep_level=1)  # weights kept in host memory
    before = engine.generate(with_meta(prompts, **meta)).batch["responses"]
    held = engine.memory_bytes()
    assert held >= engine.weights.nbytes + engine.cache.nbytes > 0
    engine.sleep()
    assert engine.memory_bytes() == 0 and engine.cache is None and engine.weights.flat is None
    with pytest.raises(RuntimeError, match="asleep"):
        engine.generate(with_meta(prompts, **meta))
    engine.wake_up(["weights"])
    engine.wake_up(["kv_cache"])
    assert engine.memory_bytes() == held
    assert torch.equal(engine.generate(with_meta(prompts, **meta)).batch["responses"], before)

    discarding = make_engine(qwen2, sleep_level=2)
    discarding.sleep()
    discarding.wake_up()
    with pytest.raises(RuntimeError, match="discarded by sleep"):
        discarding.generate(with_meta(prompts, **meta))
    discarding.update_weights(model.state_dict().items())
    assert torch.equal(discarding.generate(with_meta(prompts, **meta)).batch["responses"], before)
    with pytest.raises(ValueError, match="unknown wake-up tags"):
        discarding.wake_up(["kv"])


def test_bad_input_errors(qwen2):
    engine = make_engine(qwen2, response_length=32, prompt_length=16)
    prompts = ragged_prompts(2, 16)
    with pytest.raises(ValueError, match="rollout n must be >= 1"):
        engine.generate(with_meta(prompts, n=0))
    with pytest.raises(ValueError, match=r"prompt row 0 has 20 tokens.*max_model_len is 48"):
        engine.generate(with_meta(ragged_prompts(2, 20), do_sample=False))
    with pytest.raises(ValueError, match="max_new_tokens=40 exceeds rollout.response_length=32"):
        engine.generate(with_meta(prompts, max_new_tokens=40))
    right_padded = DataProto({k: v.flip(-1) for k, v in ragged_prompts(2, 16, min_len=4).batch.items()})
    right_padded.batch["attention_mask"][0] = 1
    with pytest.raises(ValueError, match="prompt row 1: attention_mask is not left-padded"):
        engine.generate(right_padded)
    with pytest.raises(ValueError, match=r"room for 40 tokens .* max_model_len=48 needs 48 tokens"):
        make_engine(qwen2, engine_kwargs={"native": {"kv_cache_tokens": 40}})
    with pytest.raises(ValueError, match="unknown key 'actor_rollout_ref.rollout.engine_kwargs.native.kv_cache'"):
        make_engine(qwen2, engine_kwargs={"native": {"kv_cache": 40}})
    _, config, path = qwen2
    ctx = rollout_context(path, config)
    ctx.tp_size, ctx.world_size = 2, 2
    with pytest.raises(NotImplementedError, match="tensor_model_parallel_size=1"):
        NativeEngine(ctx)


def test_kv_cache_tokens_limit_slots(qwen2):
    # 48-position sequences: 100 tokens of budget hold 2 slots, and max_num_seqs caps the slot count too
    assert make_engine(qwen2, engine_kwargs={"native": {"kv_cache_tokens": 100}}).cache_plan.slots == 2
    assert make_engine(qwen2, max_num_seqs=5).cache_plan.slots == 5
