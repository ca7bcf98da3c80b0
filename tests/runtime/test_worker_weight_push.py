"""The worker's weight push reaches an engine that starts from random weights as ONE complete push.

Engines that start with load_format=dummy (or discard weights asleep) count what arrived within one
update_weights call. The worker once called update_weights per bucket, so with a model larger than one bucket no
call was ever complete and the first generate was refused ("generate before a complete weight push") on the GPU
with both SGLang and vLLM. Here: a 1-rank gloo worker, the recording SGLang stand-in, a model of several buckets.
"""

from __future__ import annotations

import pytest
import torch

from helpers.e2e import make_config
from helpers.tiny_tokenizer import save_tiny_qwen2
from verlx.protocol import DataProto
from verlx.rollout.weight_sync import checkpoint_tensor_names

BUCKET_MB = 1


def _model_of_several_buckets(path) -> str:
    """A Qwen2 of ~1.1M parameters: three 1 MB buckets at least in bf16."""
    return save_tiny_qwen2(path, hidden_size=256, intermediate_size=1024, num_hidden_layers=1)


def _prompts(pad: int) -> DataProto:
    input_ids = torch.tensor([[pad, 5, 6, 7], [pad, pad, 8, 9]])
    mask = (input_ids != pad).long()
    return DataProto({"input_ids": input_ids, "attention_mask": mask,
                      "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
                     meta_info={"do_sample": True, "seed": 1})


def test_first_generate_follows_one_complete_multi_bucket_push(one_rank, fake_sglang, tmp_path):
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    model_dir = _model_of_several_buckets(tmp_path / "model")
    cfg = make_config(model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.load_format=dummy",
                      f"actor_rollout_ref.rollout.update_weights_bucket_megabytes={BUCKET_MB}")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    worker.init_model()
    out = worker.generate_sequences(_prompts(worker.tokenizer.pad_token_id))
    assert out.batch["responses"].shape[0] == 2

    calls = fake_sglang.names()
    pushes = [c for c in fake_sglang.calls if c[0] == "update_weights_from_tensor"]
    assert len(pushes) >= 3, "the model should span several buckets"
    pushed = {name for c in pushes for name in c[1]}
    assert pushed == checkpoint_tensor_names(model_dir) - {"lm_head.weight"}
    # one push: weights resumed, every bucket, one flush, then the KV cache, then generate
    first_push = calls.index("update_weights_from_tensor")
    assert calls[first_push - 1] == "resume_memory_occupation"
    assert calls[first_push + len(pushes):calls.index("async_generate")] == ["flush_cache", "resume_memory_occupation"]


def test_an_engine_failing_mid_generation_is_named_with_its_rank(one_rank, fake_sglang, tmp_path):
    """The error a user sees names the engine and the rank (a note on the engine's own exception, type kept)."""
    from verlx.rollout.token_io import EngineGenerationError
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    model_dir = _model_of_several_buckets(tmp_path / "model")
    cfg = make_config(model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.rollout.name=sglang", "actor_rollout_ref.rollout.load_format=dummy")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    worker.init_model()
    fake_sglang.abort_samples[1] = "scheduler process died (exit code -9)"
    prompts = _prompts(worker.tokenizer.pad_token_id)
    prompts.meta_info["global_step"] = 7
    with pytest.raises(EngineGenerationError) as info:
        worker.generate_sequences(prompts)
    assert "scheduler process died" in str(info.value)
    assert info.value.__notes__ == ["while the sglang rollout engine of rank 0 was generating (step 7); checkpoints on "
                                    "disk are not touched by a failed step"]
