"""one_step_off and async training through Ray on CPU: one trainer worker, one rollout worker (its own process,
weights broadcast over gloo), the tiny model. docs/async.md describes what is checked here."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import pytest

from helpers.e2e import make_config, read_metrics
from verlx.trainer.invariants import InvariantError
from verlx.trainer.main_ppo import run_ppo
from verlx.trainer.rollout_modes.pipeline import RolloutStalled

SEPARATE = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
            "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]
# a score that varies with the sampled text, so the weights move every step
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return (len(solution_str) % 5) / 4.0\n"
NOT_COMPARED = ("timing_s/", "timing_per_token_ms/", "perf/", "timestamp/", "async/trainer_wait_s")


def _reward(tmp_path) -> str:
    path = tmp_path / "length_reward.py"
    path.write_text(REWARD)
    return f"custom_reward_function.path={path}"


def _records(directory, step: int) -> list[dict]:
    with open(directory / f"{step}.jsonl") as f:
        return [json.loads(line) for line in f]


def test_one_step_off_trains_batch_k_while_batch_k_plus_1_generates(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                                     tmp_path):
    """Worker timestamps: batch k+1's generation (rollout worker) overlaps batch k's update (trainer worker)."""
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *SEPARATE, "trainer.rollout_mode=one_step_off",
                      "trainer.total_training_steps=3",
                      "actor_rollout_ref.rollout.name=helpers.faulty_engines:SlowEngine",
                      "+actor_rollout_ref.rollout.engine_kwargs.custom.delay_s=1.0")
    run_ppo(cfg)
    rows = read_metrics(tmp_path)
    assert [r["async/staleness/max"] for r in rows] == [0.0, 1.0, 1.0]  # batch k+1 comes from the weights before k
    assert [r["async/policy_version"] for r in rows] == [0.0, 1.0, 2.0]
    for k in (0, 1):
        update = (rows[k]["timestamp/update_actor_start"], rows[k]["timestamp/update_actor_end"])
        generation = (rows[k + 1]["timestamp/gen_start"], rows[k + 1]["timestamp/gen_end"])
        assert generation[0] < update[1] and update[0] < generation[1], (k + 1, update, generation)
    for r in rows:
        assert r["actor/on_policy_log_prob_diff_max"] == 0.0 and r["async/dropped_samples"] == 0.0
        assert r["timing_s/weight_sync"] >= 0 and "rollout_corr/kl" in r


def test_async_with_staleness_bound_0_matches_sync(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """Bound 0 = wait for the newest weights before each generation: the same samples, the same numbers."""
    common = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
              "trainer.total_training_steps=2", "actor_rollout_ref.rollout.name=native", _reward(tmp_path),
              "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # one mini-batch per step: on-policy throughout
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "sync", *common))
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "async", *common,
                        "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
                        "trainer.rollout_mode=async", "trainer.max_staleness=0"))
    sync, asynchronous = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "async")
    assert sync[1]["actor/grad_norm"] > 0 and sync[0]["critic/score/mean"] != sync[1]["critic/score/mean"]
    for a, b in zip(sync, asynchronous):
        assert a["actor/ppo_kl"] == 0.0 and a["actor/on_policy_log_prob_diff_max"] == 0.0  # the sync invariant
        assert a["async/staleness/hist/0"] == 16 and a["async/dropped_fraction"] == 0.0  # logged in sync too
        compared = [k for k in a if not k.startswith(NOT_COMPARED) and k != "timing_s/weight_sync"]
        assert set(compared) <= set(b)
        for key in compared:
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key


SLOW_ENGINES = {  # generation slower than training (about 0.1 s per token)
    "native": ["actor_rollout_ref.rollout.name=helpers.faulty_engines:SlowNativeEngine",
               "+actor_rollout_ref.rollout.engine_kwargs.custom.round_delay_s=0.1",
               "+actor_rollout_ref.rollout.engine_kwargs.native.sync_interval=1"],
    # the adapters over the stand-ins of the sglang / vllm packages (tests/helpers/fake_engines.py)
    "sglang": ["actor_rollout_ref.rollout.name=helpers.fake_engines:FakeSGLangEngine",
               "+actor_rollout_ref.rollout.engine_kwargs.custom.token_s=0.1"],
    "vllm": ["actor_rollout_ref.rollout.name=helpers.fake_engines:FakeVLLMEngine",
             "+actor_rollout_ref.rollout.engine_kwargs.custom.token_s=0.1"],
}


@pytest.mark.parametrize("engine", list(SLOW_ENGINES))
def test_partial_rollout_samples_record_both_versions(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, engine):
    """Generation slower than training: each update interrupts the batch in flight, which finishes with the new
    weights; the dumped samples name the version of every token."""
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *SEPARATE, "trainer.rollout_mode=async",
                      "trainer.max_staleness=1", "trainer.partial_rollout=true", "trainer.total_training_steps=3",
                      *SLOW_ENGINES[engine], "data.max_response_length=24",
                      f"trainer.rollout_data_dir={tmp_path / 'generations'}", _reward(tmp_path))
    run_ppo(cfg)
    rows = read_metrics(tmp_path)
    assert max(r["async/staleness/max"] for r in rows) <= 1
    assert sum(r["async/partial_samples"] for r in rows) > 0
    spanning = [rec for step in (2, 3) for rec in _records(tmp_path / "generations", step)
                if rec["rollout_policy_version"] != rec["rollout_policy_version_last"]]
    assert spanning, "no sample was continued after a weight update"
    for rec in spanning:
        versions = rec["rollout_token_versions"]
        first, last = rec["rollout_policy_version"], rec["rollout_policy_version_last"]
        assert versions[0] == first and versions[-1] == last and last == first + 1
        assert versions == sorted(versions)  # old weights first, then the new ones


def test_on_policy_check_fires_on_a_planted_mismatch(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """Attention dropout is active in the update's forward only: its log-probs differ from old_log_prob."""
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "+actor_rollout_ref.model.override_config.attention_dropout=0.5")
    with pytest.raises(InvariantError, match=r"on-policy check failed at step 1: .* differs from old_log_prob by up "
                                             r"to [0-9.e+-]+ \(trainer.on_policy_tolerance=0"):
        run_ppo(cfg)


def test_a_silent_rollout_group_stops_the_run_naming_the_phase(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                               tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *SEPARATE, "trainer.rollout_mode=one_step_off",
                      "trainer.total_training_steps=3", "trainer.rollout_stall_timeout_s=3",
                      "actor_rollout_ref.rollout.name=helpers.faulty_engines:HangingEngine",
                      "+actor_rollout_ref.rollout.engine_kwargs.custom.hang_at_step=2")
    with pytest.raises(RolloutStalled, match=r"delivered nothing for \d+s .* generating prompt batch 2 with policy "
                                             r"version 0"):
        run_ppo(cfg)
    assert [r["training/global_step"] for r in read_metrics(tmp_path)] == [1]


def test_resume_regenerates_queued_batches_in_the_same_data_order(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                                   tmp_path):
    """one_step_off takes batch k+1's prompts during step k; the checkpoint of step k saves the position after
    batch k, so a resumed run trains step k+1 on the same prompts as the original run."""
    common = [*SEPARATE, "trainer.rollout_mode=one_step_off", "trainer.total_training_steps=3"]
    first = tmp_path / "first"
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, first, *common, "trainer.save_freq=1",
                        f"trainer.rollout_data_dir={first / 'generations'}"))
    resumed = tmp_path / "resumed"
    shutil.copytree(first / "ckpt" / "global_step_2", resumed / "ckpt" / "global_step_2")
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, resumed, *common,
                        f"trainer.rollout_data_dir={resumed / 'generations'}"))
    assert [r["training/global_step"] for r in read_metrics(resumed)] == [3]

    def prompts(directory, step):
        return sorted(rec["prompt"] for rec in _records(directory / "generations", step))

    assert prompts(resumed, 3) == prompts(first, 3)
    assert prompts(first, 3) != prompts(first, 2)


#: engine → (its adapter over the stand-in, the request its server's log shows per weight push, per prompt)
SERVER_ENGINES = {"sglang": ("FakeSGLangEngine", "POST /update_weights_from_tensor", "POST /generate"),
                  "vllm": ("FakeVLLMEngine", "POST /collective_rpc", "POST /inference/v1/generate")}


@pytest.mark.parametrize("engine", list(SERVER_ENGINES))
def test_server_mode_trains_through_the_engines_http_servers(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path,
                                                             engine, fake_engine_scratch):
    """rollout.server.enable with the sglang / vllm adapter against its stand-in's HTTP server (one per replica):
    every step's weights are pushed over HTTP, the rollout runs through the servers, and the run's numbers are those
    of the same engine in-process. The stand-ins' files went to the session's scratch folder, not to /tmp."""
    before, scratch_before = set(os.listdir(tempfile.gettempdir())), set(os.listdir(fake_engine_scratch))
    adapter, push, generate = SERVER_ENGINES[engine]
    common = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=2",
              f"actor_rollout_ref.rollout.name=helpers.fake_engines:{adapter}",
              "actor_rollout_ref.rollout.load_format=dummy", _reward(tmp_path)]
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "in_process", *common))
    port = 20000 + os.getpid() % 20000
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path / "server", *common,
                        "actor_rollout_ref.rollout.server.enable=true",
                        f"actor_rollout_ref.rollout.server.port={port}",
                        f"+actor_rollout_ref.rollout.engine_kwargs.custom.request_log_dir={tmp_path}"))
    for rank in (0, 1):  # each replica's server served the pushes and the generations (its request log)
        with open(tmp_path / f"rank{rank}.log") as f:
            served = f.read()
        # the run stopped its servers cleanly: verlx removed their logs
        assert not os.path.exists(os.path.join(tempfile.gettempdir(),
                                               f"verlx_{engine}_server_rank{rank}_port{port + rank}.log"))
        pushes = served.count(push) - (engine == "vllm")  # vllm: one more call at start, for the model's names
        assert pushes == 2 and served.count(generate) >= 8
    in_process, server = read_metrics(tmp_path / "in_process"), read_metrics(tmp_path / "server")
    assert [r["training/global_step"] for r in server] == [1, 2]
    assert not {name for name in set(os.listdir(tempfile.gettempdir())) - before if name.startswith("fake_")}
    # each of the 2 ranks of both runs installed the stand-in; each server-mode rank also its server's two folders
    added = set(os.listdir(fake_engine_scratch)) - scratch_before
    assert len([name for name in added if name.startswith(f"fake_{engine}_")]) == 2 + 2 * 3
    for a, b in zip(in_process, server):
        for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean"):
            assert b[key] == pytest.approx(a[key], rel=1e-6, abs=1e-9), key
