"""GRPO learns, end to end: a seeded short run through main_ppo (a real Ray worker, the native engine, parquet
files) raises the held-out accuracy of a sloppily fine-tuned tiny model by a margin, and each planted fault of
the loop (helpers/learning_faults.py) makes that same check fail.

The task (helpers/learning_task.py) is the last digit of an unseen 3-digit number. The SFT model imitates a teacher
that answers with the first digit 60% of the time, so it samples the right digit about a quarter of the time;
GRPO has to move it towards the last digit. Held-out accuracy is sampled at temperature 1 (4 samples of each of
100 unseen numbers) with a fixed seed, so unchanged weights give exactly the same number.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

import helpers.learning_faults as faults
from helpers.e2e import make_config, read_metrics
from helpers.learning_task import DATA_SOURCE, write_splits
from verlx.models.tiny import TinyModelSpec, save_tiny_model
from verlx.trainer import ppo_trainer
from verlx.trainer.main_ppo import run_ppo

# 92-122 s for the module on 2 busy cores (SFT fixture 29-47 s, each GRPO run 7-14 s): slow, still in `pytest tests`
pytestmark = pytest.mark.slow
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELD_OUT = f"val-core/{DATA_SOURCE}/reward/mean@4"
STEPS = 10
MARGIN = 0.2  # the fault-free run gained +0.39 (0.255 -> 0.642); each planted fault left a gain <= 0


@pytest.fixture(scope="module")
def sloppy_sft(tmp_path_factory):
    """(model dir, data dir): a 2-layer tiny model fine-tuned with main_sft on the sloppy teacher's rows."""
    root = tmp_path_factory.mktemp("learning")
    data = root / "data"
    data.mkdir()
    paths = write_splits(str(data), teacher_accuracy=0.4)
    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, num_hidden_layers=2)
    base = save_tiny_model(str(root / "base"), seed=0, spec=spec)
    model = root / "sft"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread: the same floating-point history on every run
    subprocess.run(
        [sys.executable, "-m", "verlx.trainer.main_sft", f"data.train_files={paths['train']}", "data.val_files=null",
         f"model.partial_pretrain={base}", f"trainer.default_local_dir={model}", f"trainer.output_dir={root}/sft_logs",
         "trainer.total_training_steps=300", "data.train_batch_size=64", "data.micro_batch_size_per_gpu=64",
         "optim.lr=3e-3", "trainer.target_val_accuracy=null", "trainer.device=cpu", "trainer.logger=[file]"],
        cwd=REPO, env=env, check=True, capture_output=True, timeout=300,
    )
    return str(model), str(data)


def learning_overrides(*overrides) -> list[str]:
    """A short GRPO run from the sloppy SFT model on one CPU worker with the native engine."""
    return [
        "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.seed=0",
        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.load_format=auto",
        "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.rollout.temperature=1.0",
        "data.train_batch_size=16", "data.max_prompt_length=32", "data.max_response_length=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_coef=0.001", "actor_rollout_ref.model.external_lib=helpers.learning_faults",
        f"custom_reward_function.path={REPO}/tests/helpers/learning_task.py", "trainer.save_freq=-1",
        *overrides,
    ]


def held_out_gain(tmp_path, model_dir, data_dir, *overrides) -> tuple[float, float]:
    """Held-out sampled accuracy before and after STEPS GRPO steps."""
    cfg = make_config(model_dir, data_dir, tmp_path, *learning_overrides(
        f"trainer.total_training_steps={STEPS}", f"trainer.test_freq={STEPS}", "trainer.val_before_train=true",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true", "actor_rollout_ref.rollout.val_kwargs.temperature=1.0",
        "actor_rollout_ref.rollout.val_kwargs.n=4", *overrides))
    run_ppo(cfg)
    accuracy = [row[HELD_OUT] for row in read_metrics(tmp_path) if HELD_OUT in row]
    assert len(accuracy) == 2, accuracy
    return accuracy[0], accuracy[-1]


def learned(before: float, after: float) -> bool:
    return after - before >= MARGIN


def test_grpo_raises_held_out_accuracy(ray_cpu, sloppy_sft, tmp_path):
    before, after = held_out_gain(tmp_path, *sloppy_sft)
    assert 0.1 < before < 0.6, before  # the sloppy SFT model: sometimes right, so GRPO has signal
    assert learned(before, after), (before, after)


PLANTED = {
    "advantage-sign-flipped": ["algorithm.adv_estimator=grpo_sign_flipped"],
    "policy-loss-detached": ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla_detached"],
    "engine-stale-weights": ["actor_rollout_ref.rollout.name=helpers.learning_faults:StaleWeightsNativeEngine"],
    "response-mask-shifted": ["actor_rollout_ref.rollout.name=helpers.learning_faults:ShiftedMaskNativeEngine"],
    "reference-as-actor": [],
}


@pytest.mark.parametrize("fault", list(PLANTED))
def test_planted_fault_fails_the_learning_check(ray_cpu, sloppy_sft, tmp_path, monkeypatch, fault):
    if fault == "reference-as-actor":
        monkeypatch.setattr(ppo_trainer, "ActorRolloutRefWorker", faults.ReferenceRolloutWorker)
    before, after = held_out_gain(tmp_path, *sloppy_sft, *PLANTED[fault])
    assert not learned(before, after), (before, after)


def test_a_constant_reward_is_reported_within_three_steps(ray_cpu, sloppy_sft, tmp_path, caplog):
    """Bad input: a reward that scores every sample alike gives GRPO nothing; the run says so by step 3."""
    cfg = make_config(*sloppy_sft, tmp_path, *learning_overrides(
        "custom_reward_function.name=constant_score", "trainer.total_training_steps=3", "trainer.test_freq=-1"))
    with caplog.at_level(logging.WARNING, logger="verlx.trainer.reward_signal"):
        run_ppo(cfg)
    assert [row["critic/score/zero_variance_ratio"] for row in read_metrics(tmp_path)] == [1.0, 1.0, 1.0]
    [warning] = caplog.records
    message = warning.getMessage()
    assert message.startswith("step 3: for 3 steps in a row every prompt group of data_source 'last_digit' scored "
                              "the same on all its 8 samples (every sample scored 0.5;")
    assert f"Reward: custom_reward_function constant_score in {REPO}/tests/helpers/learning_task.py." in message
