"""The bad inputs a new user tries (issue 28's families), each through main_ppo's command-line entry as a user runs
it: refused before Ray starts, with a verlx message naming the key, file or row, exit status 2, and never a Python
traceback or Hydra's HYDRA_FULL_ERROR hint. The table runs in this process (a second or two a case instead of a
Python start-up each); one case runs as `python -m verlx.trainer.main_ppo` to show the process gives the same.
docs/troubleshooting.md has the same table for users."""

from __future__ import annotations

import json
import logging
import shutil
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.commands import run_module
from helpers.e2e import e2e_overrides


def model_with(tiny_model_dir, tmp_path, change) -> str:
    model = shutil.copytree(tiny_model_dir, tmp_path / "model")
    change(model)
    return str(model)


def broken_config_json(model):
    (model / "config.json").write_text('{"model_type": "qwen2",')


def truncated_weights(model):
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])


def missing_shard(model):
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}))


def rows_without_ground_truth(data_dir, tmp_path) -> str:
    rows = pq.read_table(f"{data_dir}/train.parquet").to_pylist()
    rows[5]["reward_model"] = {"style": "rule", "ground_truth": None}
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def rewritten(data_dir, tmp_path, name, change) -> str:
    """A copy of the training data as `name`, its rows changed by `change` (rows -> rows, or a file writer)."""
    rows = pq.read_table(f"{data_dir}/train.parquet").to_pylist()
    path = str(tmp_path / name)
    if name.endswith(".jsonl"):
        with open(path, "w") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)
    else:
        pq.write_table(pa.Table.from_pylist(change(rows)), path)
    return path


def empty_validation_file(data_dir, tmp_path) -> str:
    path = str(tmp_path / "empty.parquet")
    pq.write_table(pq.read_table(f"{data_dir}/test.parquet").slice(0, 0), path)
    return path


# (case, setup(tiny_model_dir, data_dir, tmp_path) -> overrides, what the message must contain)
CASES = [
    ("config.json is not JSON",
     lambda m, d, t: [f"actor_rollout_ref.model.path={model_with(m, t, broken_config_json)}"],
     "actor_rollout_ref.model.path: {t}/model/config.json is not valid JSON (Expecting property name"),
    ("truncated safetensors",
     lambda m, d, t: [f"actor_rollout_ref.model.path={model_with(m, t, truncated_weights)}"],
     "actor_rollout_ref.model.path: {t}/model/model.safetensors is truncated: "),
    ("shard missing", lambda m, d, t: [f"actor_rollout_ref.model.path={model_with(m, t, missing_shard)}"],
     "model.safetensors.index.json lists 2 weight files, of which 2 are missing from {t}/model"),
    ("negative reward workers", lambda m, d, t: ["reward.num_workers=-1"],
     "reward.num_workers=-1 is out of range: it must be >= 0"),
    ("zero reward timeout", lambda m, d, t: ["reward.num_workers=2", "reward.timeout_s=0"],
     "reward.timeout_s=0.0 is out of range: it must be > 0"),
    ("reward file with a syntax error",
     lambda m, d, t: (t.joinpath("reward.py").write_text("def compute_score(a, b:\n    return 1\n"),
                      [f"custom_reward_function.path={t}/reward.py"])[1],
     "importing custom_reward_function.path={t}/reward.py failed: SyntaxError: "),
    ("negative learning rate", lambda m, d, t: ["actor_rollout_ref.actor.optim.lr=-1e-6"],
     "actor_rollout_ref.actor.optim.lr=-1e-06 is out of range: it must be >= 0"),
    ("max_response_length=0", lambda m, d, t: ["data.max_response_length=0"],
     "data.max_response_length=0 is out of range: it must be >= 1"),
    ("ppo_epochs=0", lambda m, d, t: ["actor_rollout_ref.actor.ppo_epochs=0"],
     "actor_rollout_ref.actor.ppo_epochs=0 is out of range: it must be >= 1"),
    ("a NaN", lambda m, d, t: ["algorithm.gamma=nan"], "algorithm.gamma=nan must be a finite number"),
    ("rows without ground_truth",
     lambda m, d, t: [f"data.train_files={rows_without_ground_truth(d, t)}"],
     "{t}/train.parquet row 5: no reward_model.ground_truth, which the built-in score compares responses with"),
    ("train_files is a directory", lambda m, d, t: [f"data.train_files={d}"],
     "data.train_files: '{d}' is a directory; give the parquet file(s) in it (test.parquet, train.parquet), "
     "e.g. data.train_files={d}/train.parquet"),
    ("output directories cannot be created",
     lambda m, d, t: (t.joinpath("file").write_text("x"),
                      [f"trainer.output_dir={t}/file/out", f"trainer.default_local_dir={t}/file/ckpt"])[1],
     "trainer.default_local_dir={t}/file/ckpt: cannot create or write to {t}/file/ckpt: {t}/file is a file, not a "
     "directory"),
    ("prompts longer than max_prompt_length", lambda m, d, t: ["data.max_prompt_length=4"],
     "{d}/train.parquet row 0: the prompt is "),
    ("a typo in a key", lambda m, d, t: ["actor_rollout_ref.actor.optim.lrr=1e-6"],
     "unknown key 'actor_rollout_ref.actor.optim.lrr'. Did you mean 'lr'?"),
    ("a key in the wrong section", lambda m, d, t: ["+trainer.adv_estimator=grpo"],
     "unknown key 'trainer.adv_estimator'. "),
    ("JSON Lines instead of parquet", lambda m, d, t: [f"data.train_files={rewritten(d, t, 'train.jsonl', None)}"],
     "{t}/train.jsonl is not a parquet file: it starts with '{{' like JSON or JSON Lines."),
    ("prompts that are strings",
     lambda m, d, t: [f"data.train_files={rewritten(d, t, 's.parquet', strings_for_messages)}"],
     "{t}/s.parquet row 0: malformed prompt in column 'prompt': expected a non-empty list of {{role, content}} "
     "messages, got '"),
    ("fewer rows than a batch", lambda m, d, t: [f"data.train_files={rewritten(d, t, 'f.parquet', lambda r: r[:4])}"],
     "the dataset has 4 rows, fewer than one batch of 8 (data.train_batch_size)"),
    ("an empty validation file", lambda m, d, t: [f"data.val_files={empty_validation_file(d, t)}"],
     "no usable prompts in ['{t}/empty.parquet']"),
]
MISPLACED_HINT = "'adv_estimator' is at algorithm.adv_estimator: did you mean algorithm.adv_estimator=...?"


def strings_for_messages(rows):
    return [dict(row, prompt=row["prompt"][0]["content"]) for row in rows]


@pytest.fixture
def main_ppo_here(monkeypatch, tmp_path, capfd):
    """Run main_ppo's `main()` with a command line in this process: (exit status, stdout + stderr, stderr). Hydra's
    logging set-up is undone afterwards."""
    import ray
    from hydra.core.global_hydra import GlobalHydra

    from verlx.trainer import main_ppo

    if ray.is_initialized():  # left by an earlier test: the cases must show that they stop before Ray starts
        ray.shutdown()
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    monkeypatch.chdir(tmp_path)  # Hydra's outputs/ folder

    def run(args):
        GlobalHydra.instance().clear()
        monkeypatch.setattr(sys, "argv", ["main_ppo", *args])
        with pytest.raises(SystemExit) as info:
            main_ppo.main()
        out, err = capfd.readouterr()
        return info.value.code, out + err, err

    yield run
    for handler in root.handlers[:]:
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    GlobalHydra.instance().clear()
    if ray.is_initialized():  # a case that was not refused got as far as training
        ray.shutdown()


@pytest.mark.parametrize("case, setup, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_before_ray_with_a_message(case, setup, expected, tiny_model_dir, arithmetic_data_dir,
                                                        tmp_path, main_ppo_here):
    import ray

    overrides = setup(tiny_model_dir, arithmetic_data_dir, tmp_path)
    code, output, stderr = main_ppo_here(e2e_overrides(tiny_model_dir, arithmetic_data_dir, tmp_path / "out",
                                                       *overrides))
    assert code == 2, output[-3000:]
    assert expected.format(t=tmp_path, d=arithmetic_data_dir) in stderr, stderr[-3000:]
    if case == "a key in the wrong section":
        assert MISPLACED_HINT in stderr
    assert "error: " in stderr
    assert "Traceback" not in output and "HYDRA_FULL_ERROR" not in output
    assert not ray.is_initialized() and "Started a local Ray instance" not in output


def test_the_command_gives_the_same_in_its_own_process(tiny_model_dir, arithmetic_data_dir, tmp_path):
    """As a user runs it: a reward file that does not import (a raw SyntaxError traceback before)."""
    (tmp_path / "reward.py").write_text("def compute_score(a, b:\n    return 1\n")
    args = e2e_overrides(tiny_model_dir, arithmetic_data_dir, tmp_path / "out",
                         f"custom_reward_function.path={tmp_path}/reward.py")
    result = run_module(args, cwd=tmp_path, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert f"importing custom_reward_function.path={tmp_path}/reward.py failed: SyntaxError: " in result.stderr
    assert "Traceback" not in output and "HYDRA_FULL_ERROR" not in output
