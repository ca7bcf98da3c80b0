"""The multi-turn examples' data: GSM8K with tools (agent_name, tools_kwargs reaching check_answer through the
real RLHFDataset and tool file) and the multiplication demo (its SFT targets are, token for token, the
trajectories the agent loop builds with the tiny model's template)."""

from __future__ import annotations

import importlib.util
import json
import os

import pyarrow.parquet as pq

from verlx.config.run import DataConfig
from verlx.data import RLHFDataset
from verlx.models.tiny import build_tokenizer
from verlx.rollout.agent.chat import ChatCodec
from verlx.rollout.agent.tool_config import load_tools

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name: str):
    path = os.path.join(REPO, "examples", "data_preprocess", f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"preprocess_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def preprocess_one_question(script: str, tmp_path):
    """A GSM8K preprocessing script run on one question: the test split's row and its batch through RLHFDataset."""
    source = tmp_path / "test.jsonl"
    source.write_text(json.dumps({"question": "Tom has 3 bags of 4 apples. How many apples?",
                                  "answer": "3*4=<<3*4=12>>12\n#### 12"}) + "\n")
    written = load_script(script).main(["--local_dataset_path", str(source),
                                        "--local_save_dir", str(tmp_path / "out")])
    dataset = RLHFDataset(written["test"], build_tokenizer(), DataConfig(max_prompt_length=512, return_raw_chat=True))
    return pq.read_table(written["test"]).to_pylist()[0], dataset.get_batch([0])


def test_gsm8k_tool_rows_carry_the_agent_and_the_checkers_ground_truth(tmp_path):
    row, batch = preprocess_one_question("gsm8k_tool", tmp_path)
    assert row["agent_name"] == "tool_agent" and row["reward_model"]["ground_truth"] == "12"
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["extra_info"]["tools_kwargs"] == {"check_answer": {"ground_truth": "12"}}
    assert batch.non_tensor_batch["agent_name"][0] == "tool_agent"
    assert batch.non_tensor_batch["raw_prompt"][0][1]["content"].startswith("Tom has")
    tools = load_tools(os.path.join(REPO, "examples", "multi_turn", "gsm8k_tools.yaml"))
    assert sorted(tools) == ["calculator", "check_answer", "python"]
    checker = tools["check_answer"]
    assert "ground_truth" not in json.dumps(checker.schema)
    kwargs = batch.non_tensor_batch["extra_info"][0]["tools_kwargs"]["check_answer"]
    assert checker.execute({"answer": "12.0"}, **kwargs) == "correct"
    assert checker.execute({"answer": "13"}, **kwargs) == "incorrect"


def test_multiplication_sft_targets_are_the_agent_loops_tokens(tmp_path):
    script = load_script("multiplication_tool")
    written = script.main(["--local_save_dir", str(tmp_path), "--test_size", "10", "--tool_fraction", "0.5"])
    rows = pq.read_table(written["train"]).to_pylist()
    test = pq.read_table(written["test"]).to_pylist()
    assert len(rows) == 8100 - 10 and not {r["extra_info"]["question"] for r in rows} & \
        {r["extra_info"]["question"] for r in test}
    with_tool = [r for r in rows if r["extra_info"]["answer"].startswith("<tool_call>")]
    assert 0.45 < len(with_tool) / len(rows) < 0.55
    tok = build_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    codec = ChatCodec(tok, None, {}, [im_end, tok.eos_token_id])
    a, b = (int(x) for x in with_tool[0]["extra_info"]["question"][:-2].split("*"))
    target = tok(with_tool[0]["extra_info"]["answer"], add_special_tokens=False)["input_ids"]
    call = tok(script.tool_call(a, b) + "<|im_end|>", add_special_tokens=False)["input_ids"]
    delta = codec.delta_ids([{"role": "tool", "content": str(a * b)}])
    answer = tok(f"#### {a * b}", add_special_tokens=False)["input_ids"]
    assert target == call + delta + answer  # SFT trains exactly the tokens the rollout will build
    assert with_tool[0]["reward_model"]["ground_truth"] == str(a * b)


def test_gsm8k_interaction_rows_name_the_example_files_interaction(tmp_path):
    import asyncio

    from verlx.rollout.agent.interaction_config import load_interactions

    _, batch = preprocess_one_question("gsm8k_interaction", tmp_path)
    nt = batch.non_tensor_batch
    assert nt["agent_name"][0] == "tool_agent"
    kwargs = nt["extra_info"][0]["interaction_kwargs"]
    assert kwargs == {"name": "gsm8k", "query": "Tom has 3 bags of 4 apples. How many apples?", "ground_truth": "12"}
    interaction = load_interactions(os.path.join(REPO, "examples", "multi_turn", "gsm8k_interaction.yaml"))["gsm8k"]

    async def reply(text):
        instance = await interaction.start_interaction(None, **kwargs)
        return await interaction.generate_response(instance, [{"role": "assistant", "content": text}], **kwargs)

    assert asyncio.run(reply("3*4 = 12\n#### 12"))[:3] == (True, "Your response is correct!", 1.0)
    assert asyncio.run(reply("#### 7"))[:3] == (False, "Your response is incorrect! You need to reflect on your "
                                                "answer and try again.", 0.0)
