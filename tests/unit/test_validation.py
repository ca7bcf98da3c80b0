"""Validation metrics on real parquet prompts and a real reward manager; the rollout answers from a script (the
driver-side bookkeeping is what is tested: which score and which failure lands under which data source)."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.run import CustomRewardFunctionConfig, DataConfig, RewardConfig
from verlx.config.schema import PPOConfig
from verlx.data import RLHFDataset, write_parquet_atomic
from verlx.protocol import DataProto
from verlx.reward.loading import load_reward_function
from verlx.reward.managers import NaiveRewardManager, RewardFailure
from verlx.trainer.validation import Validator
from verlx.utils.tracking import ConsoleLogger

REWARD = """
import time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise ValueError("boom on purpose")
    if solution_str == "sleep":
        time.sleep(10**9)
    return float(solution_str == ground_truth)
"""


class ScriptedRollout:
    """Answers each prompt (by its question text) with a fixed response; the layout the rollout engines return."""

    def __init__(self, tokenizer, answers: dict[str, str], width: int = 8):
        self.tokenizer, self.answers, self.width = tokenizer, answers, width

    def generate_sequences(self, batch: DataProto) -> DataProto:
        prompts = batch.batch["input_ids"]
        texts = self.tokenizer.batch_decode(prompts.tolist(), skip_special_tokens=True)
        responses = torch.full((len(texts), self.width), self.tokenizer.pad_token_id)
        mask = torch.zeros(len(texts), self.width, dtype=torch.long)
        for row, text in enumerate(texts):
            question = text.split("user\n", 1)[1].split("\n", 1)[0]
            ids = self.tokenizer(self.answers[question], add_special_tokens=False)["input_ids"]
            responses[row, : len(ids)] = torch.tensor(ids)
            mask[row, : len(ids)] = 1
        attention_mask = torch.cat([batch.batch["attention_mask"], mask], dim=1)
        return DataProto({"prompts": prompts, "responses": responses, "response_mask": mask,
                          "attention_mask": attention_mask})


def rows(source: str, questions: list[str]) -> list[dict]:
    return [{"data_source": source, "prompt": [{"role": "user", "content": q}],
             "reward_model": {"style": "rule", "ground_truth": "7"}, "extra_info": {"index": i}}
            for i, q in enumerate(questions)]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


@pytest.fixture
def val_batches(tmp_path, tokenizer):
    path = write_parquet_atomic(rows("alpha", ["q1", "q2", "q3", "q4"]) + rows("beta", ["q5", "q6"]),
                                tmp_path / "val.parquet")
    ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=32))
    return [ds.get_batch(range(len(ds)))]


def validator(tmp_path, tokenizer, answers: dict[str, str], reward: RewardConfig):
    config = PPOConfig()
    config.trainer.n_gpus_per_node = 1
    (tmp_path / "reward.py").write_text(REWARD)
    fn = load_reward_function(CustomRewardFunctionConfig(path=str(tmp_path / "reward.py")))
    manager = NaiveRewardManager(tokenizer, fn, config=reward)
    return Validator(config, ScriptedRollout(tokenizer, answers), manager, tokenizer), manager


def test_failed_scorings_are_counted_per_data_source(tmp_path, tokenizer, val_batches, capsys):
    answers = {"q1": "7", "q2": "raise", "q3": "sleep", "q4": "8", "q5": "7", "q6": "7"}
    reward = RewardConfig(num_workers=1, timeout_s=1.0, max_error_fraction=0.5)
    v, manager = validator(tmp_path, tokenizer, answers, reward)
    with manager:
        metrics = v.run(val_batches)
    # alpha: 7 right, raise (error, scored 0), sleep (timeout, scored 0), 8 wrong → mean 1/4; beta: both right
    assert metrics["val-core/alpha/reward/mean@1"] == 0.25 and metrics["val-core/beta/reward/mean@1"] == 1.0
    assert metrics["val-aux/alpha/reward/errors"] == 1.0 and metrics["val-aux/alpha/reward/timeouts"] == 1.0
    assert metrics["val-aux/alpha/reward/error_rate"] == 0.5
    assert metrics["val-aux/beta/reward/errors"] == 0.0 and metrics["val-aux/beta/reward/timeouts"] == 0.0
    assert metrics["val-aux/beta/reward/error_rate"] == 0.0

    capsys.readouterr()
    ConsoleLogger("p", "e", {}, str(tmp_path)).log(metrics, step=3)
    header, values = capsys.readouterr().out.splitlines()
    shown = dict(zip(header.split()[1:], values.split()[1:]))
    assert shown["val_fail:alpha"] == "2" and shown["val_fail:beta"] == "0"


def test_too_many_failures_at_validation_stop_the_run_naming_validation(tmp_path, tokenizer, val_batches):
    answers = {"q1": "raise", "q2": "raise", "q3": "7", "q4": "7", "q5": "7", "q6": "7"}
    v, manager = validator(tmp_path, tokenizer, answers, RewardConfig(num_workers=0, max_error_fraction=0.1))
    with manager, pytest.raises(RewardFailure) as e:
        v.run(val_batches)
    message = str(e.value)
    assert message.startswith("validation: 2/6 reward computations failed")
    assert "ValueError: boom on purpose" in message and "reward.max_error_fraction=1.0" in message


def test_validation_generations_show_the_failure(tmp_path, tokenizer, val_batches, caplog):
    answers = {"q1": "7", "q2": "raise", "q3": "7", "q4": "7", "q5": "7", "q6": "7"}
    v, manager = validator(tmp_path, tokenizer, answers, RewardConfig(num_workers=0, max_error_fraction=0.5))
    v.config.trainer.validation_data_dir = str(tmp_path / "val_dump")
    with manager, caplog.at_level(logging.WARNING):
        v.run(val_batches)
    import json

    records = [json.loads(line) for line in (tmp_path / "val_dump" / "val_1.jsonl").read_text().splitlines()]
    assert [r["reward_status"] for r in records] == ["ok", "error", "ok", "ok", "ok", "ok"]


def test_standard_error_of_the_mean_over_prompts():
    from verlx.trainer.validation import summarise

    # 4 prompts × n=2 samples: per-prompt means 0.5, 1, 0, 0.5 → mean 0.5, sample variance (0 + .25 + .25 + 0) / 3
    scores = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    sources = np.array(["a"] * 8, dtype=object)
    metrics = summarise(scores, sources, 2, {}, np.array(["ok"] * 8, dtype=object))
    assert metrics["val-core/a/reward/mean@2"] == 0.5
    assert metrics["val-aux/a/reward/sem@2"] == pytest.approx(np.sqrt((0.5 / 3) / 4), rel=1e-12)
    one = summarise(np.array([1.0]), np.array(["a"], dtype=object), 1, {}, np.array(["ok"], dtype=object))
    assert one["val-aux/a/reward/sem@1"] == 0.0  # one prompt: no spread to estimate
