"""A GRPO step with veRL's GSM8K interaction as the simulated user, through main_ppo's driver and Ray workers on CPU
(native engine, tiny model): veRL's interaction file and class name load on the rollout worker, every model turn is
answered by the interaction, the user turns are in the response (the reward function reads them) but masked out of
the loss (the rollout dump, which decodes the masked tokens only, lacks them), and veRL's turn_scores reach the
reward function's extra_info."""

from __future__ import annotations

import collections
import json
import re

import pyarrow.parquet as pq

from helpers.e2e import make_config, read_metrics
from verlx.data import write_parquet_atomic
from verlx.trainer.main_ppo import run_ppo

INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."
VERL_CONFIG = ('interaction:\n  - name: "gsm8k"\n'
               '    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"\n    config: {}\n')
REWARD = """import json

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    with open({path!r}, "a") as f:
        f.write(json.dumps({{"solution": solution_str, "turn_scores": extra_info["turn_scores"],
                            "users": [m["content"] for m in extra_info["multi_turn"]["messages"]
                                      if m["role"] == "user"]}}) + "\\n")
    return (len(solution_str) % 5) / 4.0
"""


def interaction_data(source_dir, out_dir) -> str:
    """The arithmetic rows with extra_info.interaction_kwargs as veRL's gsm8k_multiturn_w_interaction writes it."""
    out_dir.mkdir()
    for split in ("train", "test"):
        rows = pq.read_table(f"{source_dir}/{split}.parquet").to_pylist()
        for row in rows:
            row["extra_info"] = {**row["extra_info"], "interaction_kwargs": {
                "name": "gsm8k", "query": row["extra_info"]["question"],
                "ground_truth": row["reward_model"]["ground_truth"]}}
        write_parquet_atomic(rows, str(out_dir / f"{split}.parquet"))
    return str(out_dir)


def test_a_grpo_step_with_the_gsm8k_interaction(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    data_dir = interaction_data(arithmetic_data_dir, tmp_path / "data")
    interaction_file = tmp_path / "gsm8k_interaction_config.yaml"
    interaction_file.write_text(VERL_CONFIG)
    calls = tmp_path / "reward_calls.jsonl"
    reward = tmp_path / "reward.py"
    reward.write_text(REWARD.format(path=str(calls)))
    run_ppo(make_config(tiny_model_dir, data_dir, tmp_path / "run", "algorithm.adv_estimator=grpo",
                        "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.mode=async",
                        "actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
                        "data.max_response_length=256", "actor_rollout_ref.rollout.multi_turn.max_user_turns=2",
                        f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={interaction_file}",
                        "actor_rollout_ref.rollout.agent.default_agent_loop=helpers.async_loops:ShortTurnsWithUser",
                        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
                        f"custom_reward_function.path={reward}"))
    row = read_metrics(tmp_path / "run")[0]
    assert row["multi_turn/stop_reason/max_user_turns"] == 1.0  # asked twice, the third answer ends the sample
    assert row["multi_turn/user_turns/mean"] == 2.0
    assert row["actor/grad_norm"] > 0
    records = [json.loads(line) for line in calls.read_text().splitlines()]
    assert len(records) == 16
    # three model turns of at most 3 tokens, each of the first two answered "incorrect" by the user (the tiny
    # character tokenizer decodes without whitespace)
    user = re.escape("user" + "".join(INCORRECT.split()) + "assistant")
    shape = re.compile(f"(.{{0,3}}){user}(.{{0,3}}){user}(.{{0,3}})", re.DOTALL)
    model_texts = []
    for r in records:
        assert r["turn_scores"] == [0.0, 0.0] and r["users"][-2:] == [INCORRECT, INCORRECT]
        match = shape.fullmatch(r["solution"])
        assert match, r["solution"]
        model_texts.append("".join(match.groups()))
    with open(tmp_path / "rollouts" / "1.jsonl") as f:
        trained = [json.loads(line)["response"] for line in f]
    # the dump decodes the response_mask tokens: the model's, never the user's (a sample the template check
    # excludes has none at all, multi_turn/template_mismatch counts those)
    assert not any("Yourresponse" in t for t in trained)
    masked_out = sum(t == "" for t in trained)
    assert masked_out == row["multi_turn/template_mismatch"] < 16
    assert not collections.Counter(t for t in trained if t) - collections.Counter(model_texts)
