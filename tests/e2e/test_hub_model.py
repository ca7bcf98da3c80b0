"""A hub id as the model path trains through `python -m verlx.trainer.main_ppo` and generates through
main_generation, offline, from a Hugging Face cache built on disk: the driver resolves it once and the Ray workers
load the local snapshot."""

from __future__ import annotations

import json

from helpers.commands import assert_no_traceback, run_module
from helpers.hf_cache import cache_model, offline_env

HUB_ID = "verlx-test/tiny-qwen"


def test_grpo_step_with_a_cached_hub_id(tmp_path, tiny_model_dir, arithmetic_data_dir):
    snapshot = cache_model(tmp_path / "cache", HUB_ID, tiny_model_dir)
    result = run_module([
        f"data.train_files={arithmetic_data_dir}/train.parquet", f"data.val_files={arithmetic_data_dir}/test.parquet",
        "data.train_batch_size=4", "data.max_prompt_length=32", "data.max_response_length=4",
        f"actor_rollout_ref.model.path={HUB_ID}", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false", "algorithm.adv_estimator=grpo",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1", "trainer.logger=[file]",
        "trainer.val_before_train=false", "trainer.progress_bar=false", f"trainer.output_dir={tmp_path}/out",
        f"trainer.default_local_dir={tmp_path}/ckpt", "reward.num_workers=0", "ray_kwargs.ray_init.num_cpus=4",
    ], cwd=tmp_path, env=offline_env(tmp_path / "cache"), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert_no_traceback(result)
    resolved = f"actor_rollout_ref.model.path={HUB_ID} is the Hugging Face model in {snapshot}"
    assert resolved in result.stdout + result.stderr
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        (row,) = [json.loads(line) for line in f]
    assert row["step"] == 1 and "actor/pg_loss" in row


def test_main_generation_resolves_hub_ids(tmp_path, tiny_model_dir, arithmetic_data_dir):
    args = [f"data.path={arithmetic_data_dir}/test.parquet", "trainer.device=cpu", "trainer.n_gpus_per_node=1",
            "rollout.name=hf", "data.n_samples=1", "rollout.do_sample=false", "rollout.response_length=4",
            "data.max_samples=2", f"data.output_path={tmp_path}/out.parquet", "ray_kwargs.ray_init.num_cpus=2"]
    missing = run_module([*args, f"model.path={HUB_ID}"], module="verlx.trainer.main_generation", cwd=tmp_path,
                         env=offline_env(tmp_path / "empty-cache"))
    assert missing.returncode == 2 and f"model.path='{HUB_ID}': not a local directory" in missing.stderr
    assert_no_traceback(missing)
    cache_model(tmp_path / "cache", HUB_ID, tiny_model_dir)
    found = run_module([*args, f"model.path={HUB_ID}"], module="verlx.trainer.main_generation", cwd=tmp_path,
                       env=offline_env(tmp_path / "cache"))
    assert found.returncode == 0, found.stderr
    assert f"wrote 2 rows × 1 responses to {tmp_path}/out.parquet" in found.stdout
