"""Interactions (simulated users, multi_turn.interaction_config_path): veRL's Gsm8kInteraction answers as veRL's code
does, the interaction file loads in veRL's format with errors naming the file and entry, the tool_agent loop's user
turn is token-exact and masked out of the loss, bounded by max_user_turns / max_assistant_turns, its scores are
recorded; bad data rows are named before Ray."""

from __future__ import annotations

import asyncio
import logging

import pytest

from helpers.chat_templates import build_chat_tokenizer
from helpers.scripted_policy import ScriptedStream, assert_row, enc, prompt_batch, rollout_config, scripted_response
from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.reward.gsm8k_interaction import Gsm8kInteraction
from verlx.rollout.agent.config_checks import agent_loop_findings
from verlx.rollout.agent.interaction_config import InteractionConfigError, load_interactions
from verlx.rollout.agent.runner import AgentLoopRunner
from verlx.trainer.preflight import validate

VERL_GSM8K = "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
# veRL's two messages (verl/interactions/gsm8k_interaction.py at 2026-01)
CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."
SYSTEM = {"role": "system", "content": "You are a math expert. Put your final answer in the format of `#### <answer>`."}
QUESTION = [SYSTEM, {"role": "user", "content": "What is 12*34?"}]
ON = ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
      "actor_rollout_ref.rollout.name=native"]


def answer(interaction, messages, ground_truth):
    async def go():
        instance = await interaction.start_interaction("i1", name="gsm8k", query="q", ground_truth=ground_truth)
        out = await interaction.generate_response(instance, messages, name="gsm8k", ground_truth=ground_truth)
        await interaction.finalize_interaction(instance)
        return out

    return asyncio.run(go())


def said(text):
    return [*QUESTION, {"role": "assistant", "content": text}]


# (conversation, ground truth, veRL's (terminate, message, score)); worked out by hand from veRL's code: the last
# assistant message, its last 300 characters, the last "#### <number>" with commas removed, compared with the truth
CASES = [
    (said("12*34 = 408.\n#### 408"), "408", (True, CORRECT, 1.0)),
    (said("#### 407"), "408", (False, INCORRECT, 0.0)),
    (said("The answer is 408"), "408", (False, INCORRECT, 0.0)),                 # no "####": strict reads nothing
    (said("#### 400 first, then #### 408"), "408", (True, CORRECT, 1.0)),        # the last one counts
    (said("#### 1,408"), "1408", (True, CORRECT, 1.0)),                          # commas removed
    (said("#### -3"), "-3", (True, CORRECT, 1.0)),
    (said("#### 408" + " and more words" * 25), "408", (False, INCORRECT, 0.0)),  # beyond the last 300 characters
    (said("#### 408") + [{"role": "user", "content": INCORRECT}, {"role": "assistant", "content": "#### 5"}], "408",
     (False, INCORRECT, 0.0)),                                                   # only the last assistant turn
]


@pytest.mark.parametrize("messages,truth,want", CASES)
def test_gsm8k_interaction_answers_as_verls(messages, truth, want):
    interaction = Gsm8kInteraction({"name": "gsm8k"})
    assert answer(interaction, messages, truth) == (*want, {})
    assert interaction._state == {}  # finalize frees the sample's state


# ---------------------------------------------------------------------- the interaction file
def write(tmp_path, body: str) -> str:
    path = tmp_path / "interaction.yaml"
    path.write_text(body)
    return str(path)


def test_verls_gsm8k_class_is_read_as_verlxs_and_named_as_verl_names_it(tmp_path, caplog, monkeypatch):
    from verlx.rollout.agent import entry_files

    monkeypatch.setattr(entry_files, "_said", set())
    path = write(tmp_path, f"interaction:\n  - class_name: {VERL_GSM8K}\n    config: {{}}\n"
                           f"  - name: second\n    class_name: verlx.reward.gsm8k_interaction:Gsm8kInteraction\n")
    with caplog.at_level(logging.INFO, logger="verlx.rollout.agent.entry_files"):
        interactions = load_interactions(path)
    assert sorted(interactions) == ["gsm8k", "second"]  # no name: the class name without "Interaction", lower case
    assert all(type(i) is Gsm8kInteraction for i in interactions.values())
    assert interactions["second"].name == "second" and interactions["second"].config == {"name": "second"}
    said_once = [r.getMessage() for r in caplog.records if "read as verlx's" in r.getMessage()]
    assert said_once == [f"interaction class {VERL_GSM8K} (veRL's) is read as verlx's "
                         "verlx.reward.gsm8k_interaction:Gsm8kInteraction"]
    load_interactions(path)
    assert len([r for r in caplog.records if "read as verlx's" in r.getMessage()]) == 1


@pytest.mark.parametrize("body,message", [
    ("tools: []\n", "expected a top-level 'interaction:' list"),
    ("interaction:\n  - name: a\n", "interaction[0]: needs class_name"),
    (f"interaction:\n  - name: a\n    class_name: {VERL_GSM8K}\n    configs: {{}}\n",
     "interaction[0]: unknown keys ['configs']"),
    (f"interaction:\n  - name: a\n    class_name: {VERL_GSM8K}\n  - name: a\n    class_name: {VERL_GSM8K}\n",
     "interaction[1]: a second interaction named 'a'"),
    ("interaction:\n  - name: w\n    class_name: verl.interactions.weather_interaction.WeatherInteraction\n",
     "interaction[0].class_name=verl.interactions.weather_interaction.WeatherInteraction: verlx does not support "
     "veRL's own classes"),
    ("interaction:\n  - name: a\n    class_name: verlx.rollout.agent.tools:BaseTool\n",
     "interaction[0].class_name=verlx.rollout.agent.tools:BaseTool is not a subclass of verlx's BaseInteraction"),
    (f"interaction:\n  - name: a\n    class_name: {VERL_GSM8K}\n    config: {{strict: true}}\n",
     "interaction[0]: interaction a: Gsm8kInteraction reads no config keys, got ['strict']"),
])
def test_bad_interaction_files_name_the_file_and_the_entry(tmp_path, body, message):
    path = write(tmp_path, body)
    with pytest.raises(InteractionConfigError) as e:
        load_interactions(path)
    assert str(e.value).startswith(path) and message in str(e.value)


def config(*overrides):
    return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))


def test_the_key_is_checked_before_ray(tmp_path):
    key = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
    with pytest.raises(ConfigError) as e:
        validate(config(*ON, f"{key}={tmp_path}/missing.yaml"), check_files=False)
    assert f"{key}: {key}: file '{tmp_path}/missing.yaml' does not exist" in str(e.value)
    path = write(tmp_path, f"interaction:\n  - name: gsm8k\n    class_name: {VERL_GSM8K}\n")
    findings = agent_loop_findings(config("actor_rollout_ref.rollout.mode=async", f"{key}={path}"))
    assert findings.problems == [f"{key} is set but actor_rollout_ref.rollout.multi_turn.enable=false: the "
                                 "interactions answer the tool_agent loop, which needs "
                                 "actor_rollout_ref.rollout.multi_turn.enable=true (and data.return_raw_chat=true)"]
    findings = agent_loop_findings(config(*ON, f"{key}={path}"))
    assert findings.problems == [] and len(findings.warnings) == 1
    assert "default_agent_loop=single_turn_agent, which never asks an interaction" in findings.warnings[0]
    findings = agent_loop_findings(config(*ON, f"{key}={path}",
                                          "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"))
    assert findings.problems == [] and findings.warnings == []


def test_rows_without_a_known_interaction_are_named_before_ray(tmp_path):
    from verlx.config.run import DataConfig
    from verlx.data import RLHFDataset, write_parquet_atomic
    from verlx.models.tiny import build_tokenizer
    from verlx.rollout.agent.config_checks import agent_data_problems

    extras = [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "3"}}, {"split": "train"},
              {"interaction_kwargs": {"name": "gsm9k", "ground_truth": "9"}}]
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{k}*3=?"}], "extra_info": e,
             "agent_name": "tool_agent", "reward_model": {"ground_truth": str(3 * k)}} for k, e in enumerate(extras)]
    data = write_parquet_atomic(rows, str(tmp_path / "train.parquet"))
    path = write(tmp_path, f"interaction:\n  - name: gsm8k\n    class_name: {VERL_GSM8K}\n")
    tokenizer = build_tokenizer()
    cfg = config(*ON, f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={path}")
    dataset = RLHFDataset(data, tokenizer, DataConfig(max_prompt_length=64, return_raw_chat=True))
    found = agent_data_problems(cfg, tokenizer, dataset, "data.train_files")
    assert len(found) == 1 and found[0].startswith("data.train_files: row 1 of the loaded data: extra_info has no "
                                                   "interaction_kwargs mapping")
    assert "2 of the 3 rows the interactions answer are so (rows [1, 2])" in found[0]
    dataset = RLHFDataset(data, tokenizer, DataConfig(max_prompt_length=64, return_raw_chat=True), max_samples=1)
    assert agent_data_problems(cfg, tokenizer, dataset, "data.train_files") == []


# ---------------------------------------------------------------------- the user turn in the tool_agent loop
@pytest.fixture(scope="module")
def tok():
    return build_chat_tokenizer("qwen25")



def user_delta(text: str) -> str:
    """What the Qwen2.5-style template puts after <|im_end|> for a user message (written out by hand)."""
    return f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def run(tok, turns_text, truths, response_length=512, **mt):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedStream({k: [enc(tok, t) for t in texts] for k, texts in enumerate(turns_text)}, [stop])
    interactions = {"gsm8k": Gsm8kInteraction({"name": "gsm8k"})}
    runner = AgentLoopRunner(rollout_config(response_length=response_length, default_agent_loop="tool_agent", **mt),
                             tok, [stop], tok.pad_token_id, tools={}, interactions=interactions)
    extras = [{"interaction_kwargs": {"name": "gsm8k", "query": "What is 12*34?", "ground_truth": t}} for t in truths]
    batch = runner.generate_with(backend, prompt_batch(tok, [QUESTION] * len(truths), extra_infos=extras), n=1)
    assert interactions["gsm8k"]._state == {}  # every sample's session was finalized
    return batch, backend


def test_the_interaction_answers_until_it_ends_the_conversation(tok):
    """Wrong, then right: the user's two turns are the template's deltas, masked out of the loss like tool results;
    the second ('correct') is appended and ends the sample; the scores are veRL's turn_scores."""
    model = ["#### 407<|im_end|>", "#### 408<|im_end|>"]
    batch, backend = run(tok, [model], ["408"], max_user_turns=5)
    assert_row(batch, 0, scripted_response(tok, [(model[0], True), (user_delta(INCORRECT), False), (model[1], True),
                                                 (user_delta(CORRECT), False)]))
    nt = batch.non_tensor_batch
    assert list(nt["multi_turn_turn_scores"][0]) == [0.0, 1.0]
    assert nt["multi_turn_stop_reason"][0] == "interaction_ended" and nt["multi_turn_user_turns"][0] == 2
    assert nt["multi_turn_messages"][0][2:] == [
        {"role": "assistant", "content": "#### 407"}, {"role": "user", "content": INCORRECT},
        {"role": "assistant", "content": "#### 408"}, {"role": "user", "content": CORRECT}]
    # the second request's context is the prompt, the first turn and the user's delta, token for token
    prompt = enc(tok, tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False))
    assert backend.requests[1][2] == prompt + enc(tok, model[0] + user_delta(INCORRECT))


def test_max_user_turns_and_max_assistant_turns_bound_the_user(tok):
    wrong = ["#### 1<|im_end|>", "#### 2<|im_end|>", "#### 3<|im_end|>"]
    batch, _ = run(tok, [wrong], ["408"], max_user_turns=1)
    assert_row(batch, 0, scripted_response(tok, [(wrong[0], True), (user_delta(INCORRECT), False), (wrong[1], True)]))
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "max_user_turns"
    assert list(batch.non_tensor_batch["multi_turn_turn_scores"][0]) == [0.0]
    # veRL asks no interaction after the last allowed model turn
    batch, _ = run(tok, [wrong], ["408"], max_assistant_turns=2)
    assert_row(batch, 0, scripted_response(tok, [(wrong[0], True), (user_delta(INCORRECT), False), (wrong[1], True)]))
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "max_assistant_turns"
    # max_user_turns=0 is veRL's "no limit": the user is asked after every answer, as with null
    batch, _ = run(tok, [wrong], ["408"], max_user_turns=0, max_assistant_turns=3)
    assert_row(batch, 0, scripted_response(tok, [(wrong[0], True), (user_delta(INCORRECT), False), (wrong[1], True),
                                                 (user_delta(INCORRECT), False), (wrong[2], True)]))
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "max_assistant_turns"
    assert list(batch.non_tensor_batch["multi_turn_turn_scores"][0]) == [0.0, 0.0]


def test_a_user_turn_over_the_budget_ends_the_sample_at_the_turn_boundary(tok):
    model = ["#### 407<|im_end|>"]
    budget = len(enc(tok, model[0])) + 5  # the 'incorrect' delta does not fit
    batch, _ = run(tok, [model], ["408"], response_length=budget)
    assert_row(batch, 0, scripted_response(tok, [(model[0], True)]))
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "context_over_budget"
    assert list(batch.non_tensor_batch["multi_turn_turn_scores"][0]) == [0.0]


def test_a_row_without_interaction_kwargs_fails_naming_the_sample(tok):
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    runner = AgentLoopRunner(rollout_config(default_agent_loop="tool_agent"), tok, [stop], tok.pad_token_id,
                             tools={}, interactions={"gsm8k": Gsm8kInteraction({"name": "gsm8k"})})
    with pytest.raises(ValueError, match="sample 0: extra_info has no interaction_kwargs mapping"):
        runner.generate_with(ScriptedStream({0: [[stop]]}, [stop]),
                             prompt_batch(tok, [QUESTION], extra_infos=[{"split": "train"}]), n=1)


@pytest.mark.parametrize("template,stop", [("qwen25", "<|im_end|>"), ("llama3", "<|eot_id|>"), ("qwen3", "<|im_end|>")])
def test_a_trajectory_ending_with_the_users_turn_matches_the_template(template, stop):
    """The interaction's last message ends the trajectory (with the generation prompt): the template check renders
    the conversation the same way, so such samples are trained on, not counted as mismatches."""
    tok = build_chat_tokenizer(template)
    stop_id = tok.convert_tokens_to_ids(stop)
    batch, _ = run_template(tok, stop_id, ["#### 408" + stop])
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "interaction_ended"
    assert not batch.non_tensor_batch["multi_turn_template_mismatch"][0]
    assert batch.batch["response_mask"][0].sum() == len(enc(tok, "#### 408")) + 1


def run_template(tok, stop_id, turns):
    backend = ScriptedStream({0: [enc(tok, t) for t in turns]}, [stop_id])
    runner = AgentLoopRunner(rollout_config(default_agent_loop="tool_agent"), tok, [stop_id], tok.pad_token_id,
                             tools={}, interactions={"gsm8k": Gsm8kInteraction({"name": "gsm8k"})})
    extras = [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "408"}}]
    return runner.generate_with(backend, prompt_batch(tok, [QUESTION], extra_infos=extras), n=1), backend
