"""actor_rollout_ref.rollout.mode=async (veRL's agent-loop rollout) through main_ppo's driver and Ray workers on
CPU, native engine, tiny model: it trains exactly like mode=sync; over_sample_rate cancels exactly the samples it
should (response/aborted_ratio); a tool-calling loop runs through it, also under trainer.rollout_mode=one_step_off
(off-policy training, a different key)."""

from __future__ import annotations

import json

import pytest

from helpers.async_loops import planned_length
from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import run_ppo

# a score that varies with the sampled text, so the weights move every step
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return (len(solution_str) % 5) / 4.0\n"
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "timestamp/")


def _reward(tmp_path) -> str:
    path = tmp_path / "length_reward.py"
    path.write_text(REWARD)
    return f"custom_reward_function.path={path}"


def test_mode_async_trains_exactly_like_mode_sync(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """The single-turn agent loop streams each sample's request into the native engine and gets the tokens a batch
    generate gives: every logged number of two GRPO steps is the same."""
    common = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
              "actor_rollout_ref.rollout.name=native", _reward(tmp_path)]
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "sync", *common))
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "async", *common,
                        "actor_rollout_ref.rollout.mode=async"))
    sync, asynchronous = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert sync[1]["actor/grad_norm"] > 0 and sync[0]["critic/score/mean"] != sync[1]["critic/score/mean"]
    for a, b in zip(sync, asynchronous, strict=True):
        compared = [k for k in a if not k.startswith(NOT_COMPARED)]
        assert set(compared) == {k for k in b if not k.startswith(NOT_COMPARED)}
        for key in compared:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
        assert a["response/aborted_ratio"] == 0.0


def test_over_sample_rate_cancels_the_samples_still_running(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """Each sample asks for planned_length(question) tokens (ignore_eos) and the native engine decodes one step
    per round, so a sample finishes in the round of its length: of the 16 samples of the one worker, those longer
    than the 8th shortest are cancelled (keep int(16 × 0.5) = 8, ties kept), exactly."""
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                        "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.mode=async",
                        "actor_rollout_ref.rollout.over_sample_rate=0.5", "actor_rollout_ref.rollout.ignore_eos=true",
                        "actor_rollout_ref.rollout.agent.default_agent_loop=helpers.async_loops:QuestionLengthLoop",
                        "+actor_rollout_ref.rollout.engine_kwargs.native.sync_interval=1",
                        # responses of different lengths: the same micro-batches for old_log_prob and the update
                        # keep the CPU on-policy check exact
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", _reward(tmp_path)))
    with open(tmp_path / "rollouts" / "1.jsonl") as f:
        records = [json.loads(line) for line in f]
    planned = [planned_length(r["prompt"]) for r in records]
    last_kept = sorted(planned)[8 - 1]
    want_cancelled = [p > last_kept for p in planned]
    assert 0 < sum(want_cancelled) <= 16 - 8
    assert [r["response"] == "" for r in records] == want_cancelled
    row = read_metrics(tmp_path)[0]
    assert row["response/aborted_ratio"] == sum(want_cancelled) / 16
    kept_lengths = sorted(p for p, gone in zip(planned, want_cancelled) if not gone)
    assert row["response_length_non_aborted/mean"] == pytest.approx(sum(kept_lengths) / len(kept_lengths))
    assert row["response_length/mean"] == pytest.approx(sum(kept_lengths) / 16)
    # the update ran on the batch with its empty samples (both samples of a question have the same planned length,
    # hence the same reward: GRPO's advantages, and the gradient, are zero)
    assert row["actor/grad_norm"] == 0.0 and row["actor/entropy"] > 0


def test_a_tool_loop_through_mode_async_with_one_step_off_training(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                                    tmp_path):
    """rollout.mode=async with multi_turn (a calculator call per sample) on a rollout worker of its own, while
    trainer.rollout_mode=one_step_off trains batch k during batch k+1's generation: the two keys compose."""
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                        "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
                        "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
                        "trainer.n_gpus_per_node=1", "trainer.rollout_mode=one_step_off",
                        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.mode=async",
                        "actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
                        "data.max_response_length=32",
                        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                        "actor_rollout_ref.rollout.agent.default_agent_loop=helpers.async_loops:CalculatorLoop",
                        _reward(tmp_path)))
    rows = read_metrics(tmp_path)
    assert [r["async/staleness/max"] for r in rows] == [0.0, 1.0]
    for r in rows:
        assert r["tool/calls/mean"] == 1.0 and r["tool/errors"] == 0.0
        assert r["multi_turn/num_turns/mean"] == 2.0 and r["multi_turn/stop_reason/answered"] == 1.0
        # (a random model's turn, cut at 3 tokens, sometimes re-tokenises differently: such samples are counted in
        # multi_turn/template_mismatch and masked, docs/multi_turn.md)
