"""One GRPO step of a vision-language model (tiny Qwen2-VL, tiny Qwen3-VL) through main_ppo on 2 CPU workers with the
hf engine, on geo3k-format data made by examples/data_preprocess/geo3k.py from a tiny generated image set: the rows'
images reach the rollout (training and validation) and the actor (packed, with the reference's KL loss), whose
log-probs agree with the engine's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers.e2e import make_config, read_metrics
from helpers.tiny_vlm import png_bytes, random_image, save_tiny_vlm
from verlx.config.loader import ConfigError
from verlx.data import write_parquet_atomic
from verlx.trainer.main_ppo import prepare, run_ppo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = [(28, 28), (56, 28), (28, 56), (56, 56)]


@pytest.fixture(scope="module")
def geo3k_dir(tmp_path_factory):
    """Raw rows in the hub's geometry3k layout (images, problem, answer), then the project's preprocessing script."""
    raw = tmp_path_factory.mktemp("geometry3k_raw")
    for split, count in (("train", 8), ("test", 4)):
        rows = [{"images": [{"bytes": png_bytes(random_image(*SIZES[i % 4], seed=i)), "path": None}],
                 "problem": f"<image>Find x{i}.", "answer": str(i % 3)} for i in range(count)]
        write_parquet_atomic(rows, raw / "data" / f"{split}-00000-of-00001.parquet")
    out = tmp_path_factory.mktemp("geo3k")
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/geo3k.py"), "--local_dataset_path",
                    str(raw), "--local_save_dir", str(out)], check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def vl_model_dir(tmp_path_factory):
    return save_tiny_vlm(tmp_path_factory.mktemp("tiny_vl"))


def _config(model_dir, data_dir, out_dir, *overrides):
    """The prompt is the problem, veRL's geo3k instruction (~230 characters) and the image's tokens. The log-prob
    micro-batches are the update's: the vision tower's CPU matmuls round differently for other sets of images."""
    return make_config(model_dir, data_dir, out_dir, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
                       "data.image_key=images", "data.max_prompt_length=320",
                       "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.model.use_remove_padding=true",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", *overrides)


@pytest.mark.parametrize("model_type", ["qwen2_vl", "qwen3_vl"])
def test_one_grpo_step_with_images(ray_cpu, model_type, geo3k_dir, tmp_path):
    model_dir = save_tiny_vlm(tmp_path / "model", model_type)
    # a random model never answers right: score the length, so the samples of a prompt differ and the update moves
    reward = tmp_path / "length_reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return len(solution_str) / 10\n")
    cfg = _config(model_dir, geo3k_dir, tmp_path, "actor_rollout_ref.actor.freeze_vision_tower=true",
                  f"custom_reward_function.path={reward}", "trainer.val_before_train=true")
    run_ppo(cfg)
    records = read_metrics(tmp_path)
    (metrics,) = [r for r in records if r["step"] == 1 and "actor/grad_norm" in r]
    # validation generated from the test split's images too
    assert any("val-core/hiyouga/geometry3k/reward/mean@1" in r for r in records)
    assert metrics["response_length/mean"] > 0 and metrics["critic/score/max"] > metrics["critic/score/min"]
    # the update's first mini-batch reproduces old_log_probs (same weights, same images), and the trainer's
    # log-probs are the hf engine's (both with the images and M-RoPE positions)
    assert metrics["actor/on_policy_log_prob_diff_max"] < 1e-5
    assert metrics["rollout/logprob_diff_max"] < 1e-4
    assert metrics["actor/grad_norm"] > 1e-3


@pytest.mark.parametrize(("engine", "server", "what"), [("native", "false", "image inputs"),
                                                        ("vllm", "true", "image inputs in server mode .vLLM")])
def test_engines_without_image_input_are_refused_before_ray(vl_model_dir, geo3k_dir, tmp_path, engine, server,
                                                            what):
    cfg = _config(vl_model_dir, geo3k_dir, tmp_path, f"actor_rollout_ref.rollout.name={engine}",
                  f"actor_rollout_ref.rollout.server.enable={server}")
    with pytest.raises(ConfigError, match=f"needs a rollout engine that takes {what}.*rollout.name={engine} cannot"):
        prepare(cfg)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_engines_with_image_input_get_past_the_capability_checks(vl_model_dir, geo3k_dir, tmp_path, engine):
    """Not installed on this machine: the run stops at the engine's package, after the capability checks."""
    cfg = _config(vl_model_dir, geo3k_dir, tmp_path, f"actor_rollout_ref.rollout.name={engine}")
    with pytest.raises(RuntimeError, match=f"rollout.name={engine} needs the '{engine}' package"):
        prepare(cfg)


def test_vision_language_features_not_done_yet_are_refused_before_ray(vl_model_dir, geo3k_dir, tmp_path):
    cfg = _config(vl_model_dir, geo3k_dir, tmp_path, "algorithm.adv_estimator=gae",
                  "actor_rollout_ref.model.lora_rank=8")
    with pytest.raises(ConfigError) as error:
        prepare(cfg)
    message = str(error.value)
    assert "does not support LoRA with vision-language models yet (actor_rollout_ref.model.lora_rank=8)" in message
    assert "does not support a critic with vision-language models yet (algorithm.adv_estimator=gae)" in message
