"""Reward managers on hand-built rollout batches; isolation of misbehaving reward functions."""

from __future__ import annotations

import logging
import math
import re
import time

import numpy as np
import pytest
import torch

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.run import CustomRewardFunctionConfig, OverlongBufferConfig, RewardConfig
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto
from verlx.reward.loading import load_reward_function
from verlx.reward.managers import (
    REWARD_MANAGERS,
    DAPORewardManager,
    NaiveRewardManager,
    RewardFailure,
    build_reward_manager,
)

P, R = 4, 12


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def make_batch(
    tokenizer,
    responses: list[str],
    truths: list[str],
    eos: bool = True,
    use_response_mask: bool = True,
    source: str = "arithmetic",
) -> DataProto:
    """Prompts [B, P] (left padded), responses [B, R]: the text's characters, then eos (counted as valid, as the
    rollout engines do), then pad; masks to match."""
    pad, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    prompts = torch.full((len(responses), P), pad)
    prompts[:, -2:] = torch.tensor(tokenizer("1+", add_special_tokens=False)["input_ids"])
    prompt_mask = torch.zeros(len(responses), P, dtype=torch.long)
    prompt_mask[:, -2:] = 1
    rows, masks = [], []
    for text in responses:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"] + ([eos_id] if eos and text else [])
        assert len(ids) <= R
        rows.append(ids + [pad] * (R - len(ids)))
        masks.append([1] * len(ids) + [0] * (R - len(ids)))
    batch = {"prompts": prompts, "responses": torch.tensor(rows)}
    response_mask = torch.tensor(masks)
    if use_response_mask:
        batch["response_mask"] = response_mask
    batch["attention_mask"] = torch.cat([prompt_mask, response_mask], dim=1)
    non_tensor = {
        "data_source": [source] * len(responses),
        "reward_model": [{"style": "rule", "ground_truth": t} for t in truths],
        "extra_info": [{"index": i} for i in range(len(responses))],
    }
    return DataProto(batch, non_tensor)


def custom(tmp_path, body: str, name: str = "compute_score", **kwargs):
    path = tmp_path / "reward_fn.py"
    path.write_text(body)
    return load_reward_function(CustomRewardFunctionConfig(path=str(path), name=name, reward_kwargs=kwargs))


def test_registry():
    assert REWARD_MANAGERS.names() == ["dapo", "gdpo", "naive"]
    assert REWARD_MANAGERS.get("dapo") is DAPORewardManager


def test_gdpo_manager_tells_the_reward_function_the_experiment_name(tmp_path, tokenizer):
    """veRL 2026's GDPO example picks the chat format by extra_info['experiment_name'] (its rlla.py)."""
    fn = custom(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    fmt = 1.0 if 'qwen' in extra_info['experiment_name'] else 0.0\n"
        "    return {'score': fmt + extra_info['index'], 'format_reward': fmt}\n",
    )
    batch = make_batch(tokenizer, ["ab3", "ab4"], ["3", "3"])
    gdpo = REWARD_MANAGERS.get("gdpo")
    with gdpo(tokenizer, fn, config=RewardConfig(num_workers=0), experiment_name="qwen3_8b_gdpo") as manager:
        result = manager(batch)
    assert result.extra["score"].tolist() == [1.0, 2.0] and result.extra["format_reward"].tolist() == [1.0, 1.0]
    assert batch.non_tensor_batch["extra_info"][0] == {"index": 0}  # the batch's own extra_info is not touched


@pytest.mark.parametrize("use_response_mask", [True, False])
def test_score_sits_on_the_last_valid_response_token(tokenizer, use_response_mask):
    batch = make_batch(
        tokenizer,
        ["#### 3", "#### 4", "x #### 12", "#### 3"],
        ["3", "3", "12", "3"],
        use_response_mask=use_response_mask,
    )
    batch.batch["response_mask" if use_response_mask else "attention_mask"][3, -R:][7:] = 0  # already 0: pads
    with NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=0)) as manager:
        result = manager(batch)
    # "#### 3" is 6 characters + eos → last valid index 6; "x #### 12" is 9 + eos → index 9
    expected = torch.zeros(4, R)
    expected[0, 6] = 1.0
    expected[2, 9] = 1.0
    expected[3, 6] = 1.0
    assert torch.equal(result.token_level_scores, expected)
    assert result.token_level_scores.dtype == torch.float32
    assert result.extra["score"].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert result.extra["reward_status"].tolist() == ["ok"] * 4
    assert result.metrics == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/error_rate": 0.0}


def test_empty_response_and_holes_in_the_mask(tmp_path, tokenizer):
    fn = custom(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return len(solution_str) + 0.25\n",
    )
    batch = make_batch(tokenizer, ["", "abc", "abcdef"], ["", "", ""])
    batch.batch["response_mask"][2, 2] = 0  # a masked token inside the response (e.g. a tool output)
    with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=0)) as manager:
        result = manager(batch)
    # empty → 0.25 on column 0 (masked, but sum(-1) stays the reward); "abc"+eos → index 3; "abcdef"+eos → index 6
    assert result.token_level_scores[0].tolist() == [0.25] + [0.0] * (R - 1)
    assert result.token_level_scores[1, 3] == 3.25 and result.token_level_scores[2, 6] == 6.25
    assert result.token_level_scores.sum(-1).tolist() == [0.25, 3.25, 6.25]


def test_dict_returns_become_extra_columns(tmp_path, tokenizer):
    fn = custom(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    ok = solution_str.endswith(ground_truth)\n"
        "    out = {'score': 2.0 if ok else -1.0, 'acc': ok, 'pred': solution_str[-1:], 'ids': [1, 2]}\n"
        "    if extra_info['index'] == 1:\n        out['note'] = 'second'\n"
        "    return out\n",
    )
    batch = make_batch(tokenizer, ["ab3", "ab4"], ["3", "3"])
    with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=0)) as manager:
        result = manager(batch)
    assert result.extra["score"].tolist() == [2.0, -1.0]
    assert result.extra["acc"].tolist() == [1.0, 0.0]
    assert result.extra["pred"].tolist() == ["3", "4"]
    assert result.extra["note"].tolist() == [None, "second"]
    assert result.extra["ids"].shape == (2,) and result.extra["ids"][1] == [1, 2]
    assert result.token_level_scores[0, 3] == 2.0 and result.token_level_scores[1, 3] == -1.0


def test_dapo_overlong_shaping_by_hand(tmp_path, tokenizer):
    fn = custom(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    buffer = OverlongBufferConfig(enable=True, len=4, penalty_factor=0.5, log=True)
    # response lengths (eos included): 6, 8, 10, 12 tokens
    batch = make_batch(tokenizer, ["a" * 5, "a" * 7, "a" * 9, "a" * 11], ["", "", "", ""])
    with DAPORewardManager(
        tokenizer, fn, config=RewardConfig(num_workers=0), overlong_buffer=buffer, max_response_length=12
    ) as manager:
        result = manager(batch)
    # expected length 12 - 4 = 8; penalty = min(-(L - 8) / 4 * 0.5, 0): L=6 → 0, 8 → 0, 10 → -0.25, 12 → -0.5
    assert result.extra["overlong_reward"].tolist() == [0.0, 0.0, -0.25, -0.5]
    assert result.extra["overlong"].tolist() == [False, False, True, True]
    assert result.extra["score"].tolist() == [1.0, 1.0, 1.0, 1.0]
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.75, 0.5]
    assert result.token_level_scores[3, 11] == 0.5 and result.token_level_scores[2, 9] == 0.75


def test_shaping_config_errors(tokenizer):
    enabled = OverlongBufferConfig(enable=True, len=4)
    with pytest.raises(ValueError, match="needs reward_model.reward_manager=dapo"):
        NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=0), overlong_buffer=enabled)
    with pytest.raises(ValueError, match="overlong_buffer.len=4 must not exceed data.max_response_length=3"):
        DAPORewardManager(tokenizer, config=RewardConfig(num_workers=0), overlong_buffer=enabled, max_response_length=3)
    with pytest.raises(ValueError, match="overlong_buffer.len must be > 0"):
        DAPORewardManager(
            tokenizer, config=RewardConfig(num_workers=0), overlong_buffer=OverlongBufferConfig(enable=True)
        )
    with pytest.raises(ValueError, match="reward.max_error_fraction must be within"):
        NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=0, max_error_fraction=1.5))


MISBEHAVING = """
import math, time

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "raise":
        raise ValueError("boom on purpose")
    if solution_str == "text":
        return "abc"
    if solution_str == "nan":
        return math.nan
    if solution_str == "sleep":
        time.sleep(1e9)
    if solution_str == "slow":
        time.sleep(0.2)
    if solution_str == "spin":
        while True:
            pass
    return float(solution_str == ground_truth)
"""


def test_isolation_counts_marks_and_finishes_in_bounded_time(tmp_path, tokenizer, caplog):
    fn = custom(tmp_path, MISBEHAVING)
    texts = ["7", "raise", "sleep", "7", "text", "spin", "nan", "8", "sleep", "spin", "7"]
    batch = make_batch(tokenizer, texts, ["7"] * len(texts))
    timeout = 6.0  # long beside process start-up on a loaded machine: the bound below then tells 1 from 2 timeouts
    config = RewardConfig(num_workers=2, timeout_s=timeout, error_score=-1.0, show_errors=2, max_error_fraction=1.0)
    with NaiveRewardManager(tokenizer, fn, config=config) as manager:
        with caplog.at_level(logging.WARNING, logger="verlx.reward.managers"):
            start = time.perf_counter()
            result = manager(batch)
            elapsed = time.perf_counter() - start
        # 4 samples never return: on 2 processes one after another that would be >= 2 timeouts (12 s);
        # stuck processes hand their queue to fresh ones, so the batch takes about one timeout.
        assert elapsed < 1.9 * timeout, f"batch took {elapsed:.1f}s"
        status = result.extra["reward_status"].tolist()
        assert status == ["ok", "error", "timeout", "ok", "error", "timeout", "error", "ok", "timeout", "timeout", "ok"]
        assert result.extra["score"].tolist() == [1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 0.0, -1.0, -1.0, 1.0]
        assert result.metrics == {"reward/errors": 3.0, "reward/timeouts": 4.0, "reward/error_rate": 7 / 11}
        # the first show_errors=2 failures are logged with their text and traceback
        failures = [r for r in caplog.records if "reward computation failed" in r.getMessage()]
        assert len(failures) == 2
        assert (
            "sample 1 (error)" in failures[0].getMessage() and "ValueError: boom on purpose" in failures[0].getMessage()
        )
        assert "response:\nraise" in failures[0].getMessage()
        assert "sample 2 (timeout)" in failures[1].getMessage() and "reward.timeout_s" in failures[1].getMessage()

        # the pool survives and is reused from step to step (processes killed above are replaced once)
        pids = lambda: {w.proc.pid for w in manager._pool._workers if w is not None}  # noqa: E731
        survivors = pids()
        again = make_batch(tokenizer, ["7", "8", "7", "7"], ["7"] * 4)
        assert manager(again).extra["score"].tolist() == [1.0, 0.0, 1.0, 1.0]
        assert survivors <= pids() and len(pids()) == 2
        reused = pids()
        assert manager(again).extra["score"].tolist() == [1.0, 0.0, 1.0, 1.0]
        assert pids() == reused
        procs = [w.proc for w in manager._pool._workers if w is not None]
    assert all(p.poll() is not None for p in procs), "close() must end the scoring processes"


def test_consecutive_hung_samples_time_out_side_by_side(tmp_path, tokenizer):
    """Six responses in a row that all hang (one prompt's group, say) cost about one timeout: each is handed to a
    fresh process as soon as it runs far longer than samples usually take. Today's chunking gives all six to one
    process; one after another they would take 6 timeouts (30 s)."""
    fn = custom(tmp_path, MISBEHAVING)
    texts = ["7"] * 8 + ["sleep"] * 6 + ["7"] * 50  # 64 samples on 2 processes: chunks of 8
    timeout = 5.0
    config = RewardConfig(num_workers=2, timeout_s=timeout, max_error_fraction=1.0)
    with NaiveRewardManager(tokenizer, fn, config=config) as manager:
        manager(make_batch(tokenizer, ["7"] * 8, ["7"] * 8))  # a step before: the pool knows how long samples take
        start = time.perf_counter()
        result = manager(make_batch(tokenizer, texts, ["7"] * len(texts)))
        elapsed = time.perf_counter() - start
    assert result.extra["reward_status"].tolist() == ["ok"] * 8 + ["timeout"] * 6 + ["ok"] * 50
    assert result.metrics["reward/timeouts"] == 6.0
    assert elapsed < 2 * timeout, f"6 hung samples took {elapsed:.1f}s with reward.timeout_s={timeout:g}"


def test_a_slow_but_working_reward_keeps_its_processes(tmp_path, tokenizer):
    """Samples that take 0.2 s each are slow, not stuck: after the first finished sample the hand-over waits for
    ten times that, so no process is replaced (no fresh interpreter per sample)."""
    fn = custom(tmp_path, MISBEHAVING)
    batch = make_batch(tokenizer, ["slow"] * 8, ["7"] * 8)
    with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=2, timeout_s=30)) as manager:
        for _ in range(2):
            assert manager(batch).extra["reward_status"].tolist() == ["ok"] * 8
        assert manager._pool.replacements == 0 and manager._pool.hedge_after_s >= 1.0


def test_invalid_returns_are_described(tmp_path, tokenizer, caplog):
    fn = custom(tmp_path, MISBEHAVING)
    batch = make_batch(tokenizer, ["text", "nan", "7"], ["7"] * 3)
    config = RewardConfig(num_workers=0, show_errors=5, max_error_fraction=1.0)
    with NaiveRewardManager(tokenizer, fn, config=config) as manager:
        with caplog.at_level(logging.WARNING, logger="verlx.reward.managers"):
            result = manager(batch)
    assert result.extra["reward_status"].tolist() == ["error", "error", "ok"]
    assert "returned 'abc' (str); it must return a finite number" in caplog.text
    assert "returned nan (float)" in caplog.text


def test_every_sample_failing_raises_with_the_first_traceback(tmp_path, tokenizer):
    fn = custom(tmp_path, MISBEHAVING)
    batch = make_batch(tokenizer, ["raise", "nan", "raise"], ["7"] * 3)
    """Even reward.max_error_fraction=1.0 (train on failed samples) refuses a batch in which nothing was scored."""
    all_allowed = RewardConfig(num_workers=1, timeout_s=5, max_error_fraction=1.0)
    with NaiveRewardManager(tokenizer, fn, config=all_allowed) as manager:
        with pytest.raises(RewardFailure) as e:
            manager(batch)
    message = str(e.value)
    assert "3/3 reward computations failed (3 errors, 0 timeouts): every sample" in message
    assert "no setting trains on a batch without rewards" in message
    assert (
        "sample 0 (error)" in message
        and "ValueError: boom on purpose" in message
        and "line 6, in compute_score" in message
    )
    timeouts = RewardConfig(num_workers=2, timeout_s=0.5, max_error_fraction=1.0)
    with NaiveRewardManager(tokenizer, fn, config=timeouts) as manager:
        with pytest.raises(RewardFailure, match="2/2 reward computations failed \\(0 errors, 2 timeouts\\)"):
            manager(make_batch(tokenizer, ["sleep", "spin"], ["7"] * 2))


def test_max_error_fraction(tmp_path, tokenizer):
    fn = custom(tmp_path, MISBEHAVING)
    batch = make_batch(tokenizer, ["7", "raise", "7", "raise"], ["7"] * 4)
    with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=0, max_error_fraction=0.5)) as manager:
        assert manager(batch).metrics["reward/error_rate"] == 0.5  # 2/4 is not more than 0.5
    with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=1, max_error_fraction=0.25)) as manager:
        with pytest.raises(RewardFailure, match="more than reward.max_error_fraction=0.25"):
            manager(batch)
        # the aborted batch leaves a usable pool behind
        assert manager(make_batch(tokenizer, ["7"], ["7"])).extra["score"].tolist() == [1.0]
    # Once the failure budget is spent the outcome is certain: the batch stops without waiting out the hung samples.
    config = RewardConfig(num_workers=1, timeout_s=30, max_error_fraction=0.0)
    with NaiveRewardManager(tokenizer, fn, config=config) as manager:
        start = time.perf_counter()
        with pytest.raises(RewardFailure, match="ValueError: boom on purpose"):
            manager(make_batch(tokenizer, ["raise", "sleep", "sleep"], ["7"] * 3))
        assert time.perf_counter() - start < 10


def test_the_default_stops_a_mostly_broken_reward_and_says_how_to_relax(tmp_path, tokenizer):
    """reward.max_error_fraction defaults to 0.1: 2 failures in 20 train on, 3 in 20 stop the run with the failed
    samples, the first traceback and the key that lets a run train on anyway."""
    assert RewardConfig().max_error_fraction == 0.1
    fn = custom(tmp_path, MISBEHAVING)
    two = ["7"] * 20
    two[4] = two[11] = "raise"
    three = list(two)
    three[17] = "nan"
    for workers in (0, 1):
        with NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=workers)) as manager:
            assert manager(make_batch(tokenizer, two, ["7"] * 20)).metrics["reward/errors"] == 2.0
            with pytest.raises(RewardFailure) as e:
                manager(make_batch(tokenizer, three, ["7"] * 20))
        message = str(e.value)
        assert message.startswith("3/20 reward computations failed (3 errors, 0 timeouts)"), message
        assert "more than reward.max_error_fraction=0.1" in message and "Failed samples: 4, 11, 17." in message
        assert "reward.max_error_fraction=1.0" in message and "ValueError: boom on purpose" in message


def test_samples_left_unscored_after_the_budget_is_spent_are_not_called_errors(tmp_path, tokenizer):
    fn = custom(tmp_path, MISBEHAVING)
    batch = make_batch(tokenizer, ["raise"] * 4 + ["7"] * 60, ["7"] * 64)
    config = RewardConfig(num_workers=1, max_error_fraction=0.0)
    with NaiveRewardManager(tokenizer, fn, config=config) as manager, pytest.raises(RewardFailure) as e:
        manager(batch)
    # One process gets a chunk of 16 (4 of them failing); once a failure spends the budget of 0, the rest of the
    # batch is given up: those samples were never scored, so they are counted apart from the failures.
    match = re.match(r"(\d+)/64 reward computations failed \((\d+) errors, 0 timeouts; (\d+) samples left unscored "
                     r"once the outcome was certain\)", str(e.value))
    assert match, str(e.value)
    failed, errors, unscored = map(int, match.groups())
    assert failed == errors and 1 <= errors <= 4 and unscored >= 48


def test_builtin_scores_in_the_pool_and_missing_ground_truth(tokenizer):
    batch = make_batch(tokenizer, ["#### 3", "#### 4"], ["3", "3"], source="openai/gsm8k")
    with NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=2, timeout_s=10)) as manager:
        assert manager(batch).extra["score"].tolist() == [1.0, 0.0]
        batch.non_tensor_batch["reward_model"] = np.array([{}, {}], dtype=object)
        with pytest.raises(RewardFailure, match="no ground truth to score data_source 'openai/gsm8k'"):
            manager(batch)
    with NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=0), reward_fn_key="source") as manager:
        with pytest.raises(KeyError, match="no non-tensor 'source' \\(data.reward_fn_key\\)"):
            manager(batch)


def test_build_reward_manager_from_the_run_config(tmp_path, tokenizer):
    config = PPOConfig()
    config.reward_model.reward_manager = "dapo"
    config.reward_model.overlong_buffer = OverlongBufferConfig(enable=True, len=2, penalty_factor=1.0)
    config.data.max_response_length = R
    config.reward.num_workers = 0
    config.custom_reward_function.path = str(tmp_path / "r.py")
    (tmp_path / "r.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info, bonus=0):\n    return 1.0 + bonus\n"
    )
    config.custom_reward_function.reward_kwargs = {"bonus": 1}
    with build_reward_manager(config, tokenizer) as manager:
        assert isinstance(manager, DAPORewardManager)
        # lengths 12 and 11 with expected length 10: penalties -(12-10)/2 = -1 and -(11-10)/2 = -0.5
        result = manager(make_batch(tokenizer, ["a" * 11, "a" * 10], ["", ""]))
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.5]
    config.reward_model.reward_manager = "navie"
    with pytest.raises(KeyError, match="Did you mean 'naive'"):
        build_reward_manager(config, tokenizer)


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("cloudpickle") is not None, reason="cloudpickle can send local functions"
)
def test_a_function_the_workers_cannot_load_is_refused_clearly(tokenizer):
    def local_score(data_source, solution_str, ground_truth, extra_info):
        return 1.0

    with pytest.raises(TypeError, match="cannot be sent to the scoring processes.*reward.num_workers=0"):
        NaiveRewardManager(tokenizer, local_score, config=RewardConfig(num_workers=1))
    assert math.isfinite(
        NaiveRewardManager(tokenizer, local_score, config=RewardConfig(num_workers=0))(
            make_batch(tokenizer, ["x"], [""])
        ).extra["score"][0]
    )


def test_a_reward_file_that_breaks_in_the_workers_fails_at_start(tmp_path, tokenizer):
    fn = custom(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 1.0\n")
    (tmp_path / "reward_fn.py").unlink()  # loads in the driver, cannot load in the scoring processes
    from verlx.reward.isolation import WorkerStartError

    with pytest.raises(WorkerStartError, match="could not load the reward function(.|\\n)*reward_fn.py does not exist"):
        NaiveRewardManager(tokenizer, fn, config=RewardConfig(num_workers=1))


def test_a_large_batch_goes_through_the_warm_pool(tokenizer):
    """1,024 GSM8K-style samples through 2 scoring processes: every sample scored, by the same processes as the
    step before (none replaced). Speed is measured by benchmarks/reward_overhead.py, not asserted here."""
    batch = make_batch(tokenizer, ["#### 3", "#### 4"] * 512, ["3"] * 1024, source="openai/gsm8k")
    with NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=2, timeout_s=10)) as manager:
        manager(batch)  # warm
        pids = {w.proc.pid for w in manager._pool._workers}
        result = manager(batch)
        assert {w.proc.pid for w in manager._pool._workers} == pids and manager._pool.replacements == 0
    assert result.extra["score"].tolist() == [1.0, 0.0] * 512
    assert set(result.extra["reward_status"].tolist()) == {"ok"}


ORPHAN_DRIVER = """
import os, sys, threading, time
sys.path[:0] = {paths!r}
from verlx.reward.loading import FileRewardFunction
from verlx.reward.isolation import ScorePool
pool = ScorePool(FileRewardFunction({reward_file!r}), num_workers=1, timeout_s=600)
spin = dict(data_source="x", solution_str="spin", ground_truth="1", extra_info=None)
threading.Thread(target=pool.map, args=([spin],), daemon=True).start()
time.sleep(0.5)
print(pool._workers[0].proc.pid, flush=True)
os._exit(0)  # the driver dies without closing the pool
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs /proc")
def test_scoring_processes_exit_when_the_driver_dies(tmp_path):
    import subprocess
    import sys

    (tmp_path / "spin.py").write_text(MISBEHAVING)
    script = ORPHAN_DRIVER.format(paths=sys.path, reward_file=str(tmp_path / "spin.py"))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(pid), "a scoring process outlived its driver"
