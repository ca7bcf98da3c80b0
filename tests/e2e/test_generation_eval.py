"""main_generation on 2 CPU workers (hf engine, rollout-only workers) and main_eval on hand-written generations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from verlx.config.evaluation import EvaluationConfig
from verlx.config.generation import GenerationConfig
from verlx.config.loader import ConfigError, DataError, build, load_yaml, to_container
from verlx.reward.managers import RewardFailure
from verlx.trainer.main_eval import run_eval
from verlx.trainer.main_generation import METADATA_KEY, run_generation, validate


def generation_config(*overrides) -> GenerationConfig:
    base = ["trainer.n_gpus_per_node=2", "trainer.device=cpu", "rollout.name=hf", "rollout.prompt_length=32",
            "rollout.response_length=8"]
    return build(GenerationConfig, to_container(load_yaml("generation", [*base, *overrides],
                                                          schema=GenerationConfig)))


def eval_config(*overrides) -> EvaluationConfig:
    return build(EvaluationConfig, to_container(load_yaml("evaluation", list(overrides), schema=EvaluationConfig)))


# ---------------------------------------------------------------------- main_generation
def test_generation_from_the_saved_weights_keeps_rows_and_writes_n_responses(ray_cpu, tiny_model_dir,
                                                                            arithmetic_data_dir, tmp_path):
    """Rollout-only workers generate from the weights in model.path. Sampling with top_k=1 is greedy, so each of
    the 3 samples of a prompt must equal transformers' greedy decoding of that prompt alone: this checks the
    weights and that every response lands on its own prompt's row although prompts are batched by length.
    Batches of 5 over 16 rows end with one prompt (3 samples), which does not split evenly over the 2 workers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = tmp_path / "test.parquet"
    shutil.copy(os.path.join(arithmetic_data_dir, "test.parquet"), source)
    written = run_generation(generation_config(
        f"data.path={source}", f"model.path={tiny_model_dir}", "data.n_samples=3", "data.batch_size=5",
        "rollout.temperature=1.0", "rollout.top_k=1"))
    assert written == str(tmp_path / "test.generations.parquet")  # output_path null: next to the input
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp")]  # the atomic write left no temp file

    original, generated = pq.read_table(source), pq.read_table(written)
    assert generated.column_names == original.column_names + ["responses"]
    assert generated.select(original.column_names).equals(original)  # every input row, same order, same values
    assert generated.schema.field("responses").type == pa.list_(pa.string())
    recorded = json.loads(generated.schema.metadata[METADATA_KEY])
    assert recorded["data"]["n_samples"] == 3 and recorded["rollout"]["name"] == "hf"

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    stop = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
    prompts, responses = generated.column("prompt").to_pylist(), generated.column("responses").to_pylist()
    for prompt, samples in zip(prompts, responses):
        text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
        with torch.no_grad():
            greedy = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                                    eos_token_id=stop, pad_token_id=tokenizer.pad_token_id)
        assert samples == [tokenizer.decode(greedy[0, ids.shape[1]:], skip_special_tokens=True)] * 3


def test_generation_config_problems_are_named_before_ray(tiny_model_dir, arithmetic_data_dir):
    source = os.path.join(arithmetic_data_dir, "test.parquet")
    with pytest.raises(ConfigError) as info:
        validate(generation_config(f"data.path={source}", f"model.path={tiny_model_dir}", "rollout.load_format=dummy",
                                   "data.n_samples=2", "rollout.temperature=0", "rollout.n=4",
                                   "data.truncation=lefft", "rollout.name=vlm", "rollout.multi_turn.enable=true"))
    text = str(info.value)
    assert "rollout.load_format=dummy: nothing pushes weights into the engine" in text
    assert "data.n_samples=2 with greedy decoding" in text and "identical responses" in text
    assert "rollout.n=4: the number of samples per prompt is data.n_samples" in text
    assert "data.truncation='lefft'" in text and "Did you mean 'left'?" in text
    assert "rollout.name='vlm' is not a registered engine" in text and "Did you mean 'vllm'?" in text
    assert "rollout.multi_turn.enable=true: main_generation writes single-turn responses" in text
    with pytest.raises(ConfigError, match="model.path: '/nowhere' is not a HuggingFace model directory"):
        validate(generation_config(f"data.path={source}", "model.path=/nowhere"))


# ---------------------------------------------------------------------- main_eval
def write_generations(path, rows) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def row(source: str, truth: str, responses: list[str]) -> dict:
    return {"data_source": source, "prompt": [{"role": "user", "content": "q"}],
            "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": 0},
            "responses": responses}


def test_builtin_scores_pass_at_k_per_data_source(tmp_path, capsys):
    path = write_generations(tmp_path / "gen.parquet", [
        row("arithmetic", "5", ["#### 5", "#### 4"]),   # scores 1, 0
        row("openai/gsm8k", "12", ["no idea", "so #### 12"]),  # 0, 1
        row("arithmetic", "7", ["#### 7", "#### 7.0"]),  # 1, 1
        row("arithmetic", "3", ["3", "#### 2"]),  # 0, 0 (strict: no '#### 3')
    ])
    payload = run_eval(eval_config(f"data.path={path}", "reward.num_workers=1"))
    arithmetic = payload["data_sources"]["arithmetic"]
    # correct counts c = 1, 2, 0 of n = 2
    assert arithmetic["pass@1"] == pytest.approx((1 / 2 + 2 / 2 + 0 / 2) / 3)
    assert arithmetic["pass@2"] == pytest.approx((1 + 1 + 0) / 3)  # 1 - C(2-c, 2)/C(2, 2): 1 when c >= 1
    assert arithmetic["mean@2"] == pytest.approx(3 / 6)
    assert (arithmetic["prompts"], arithmetic["n"], arithmetic["errors"], arithmetic["timeouts"]) == (3, 2, 0, 0)
    gsm8k = payload["data_sources"]["openai/gsm8k"]
    assert (gsm8k["pass@1"], gsm8k["pass@2"], gsm8k["mean@2"]) == (0.5, 1.0, 0.5)

    with open(tmp_path / "gen.eval.json") as f:  # output_path null: next to the input
        assert json.load(f) == payload
    table = capsys.readouterr().out
    assert "pass@1" in table and "openai/gsm8k" in table and f"wrote {tmp_path / 'gen.eval.json'}" in table


CUSTOM_REWARD = """
def partial_match(data_source, solution_str, ground_truth, extra_info=None, partial=0.5):
    if solution_str == "boom":
        raise RuntimeError("the scorer broke on purpose")
    if solution_str == ground_truth:
        return 1.0
    return partial if ground_truth in solution_str else 0.0
"""


def test_custom_reward_function_threshold_and_counted_errors(tmp_path):
    (tmp_path / "reward.py").write_text(CUSTOM_REWARD)
    path = write_generations(tmp_path / "gen.parquet", [
        row("mine", "a", ["a", "xa", "b", "c"]),  # 1, .5, 0, 0    -> 1 correct
        row("mine", "b", ["b", "b", "xb", "b"]),  # 1, 1, .5, 1    -> 3 correct
        row("mine", "c", ["boom", "c", "c", "q"]),  # error→0, 1, 1, 0 -> 2 correct
    ])
    out = tmp_path / "report" / "eval.json"
    payload = run_eval(eval_config(f"data.path={path}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
                                   "custom_reward_function.name=partial_match", f"output_path={out}"))
    mine = payload["data_sources"]["mine"]
    assert mine["pass@1"] == pytest.approx((1 / 4 + 3 / 4 + 2 / 4) / 3)
    # pass@2 per row: 1 - C(3,2)/C(4,2) = 1/2; 1 - C(1,2)/C(4,2) = 1; 1 - C(2,2)/C(4,2) = 5/6
    assert mine["pass@2"] == pytest.approx((1 / 2 + 1 + 5 / 6) / 3)
    assert mine["pass@4"] == pytest.approx(1.0)
    assert mine["mean@4"] == pytest.approx((1.5 + 3.5 + 2.0) / 12)
    assert mine["errors"] == 1 and out.is_file()
    # a lower threshold counts the partial matches as correct: c = 2, 4, 2
    lenient = run_eval(eval_config(f"data.path={path}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
                                   "custom_reward_function.name=partial_match", "metrics.pass_threshold=0.5",
                                   f"output_path={out}"))
    assert lenient["data_sources"]["mine"]["pass@1"] == pytest.approx((2 / 4 + 4 / 4 + 2 / 4) / 3)


def test_bad_generations_files_are_named(tmp_path):
    ragged = write_generations(tmp_path / "ragged.parquet", [row("arithmetic", "1", ["a", "b"]),
                                                            row("arithmetic", "2", ["a"])])
    with pytest.raises(ValueError, match="row 1: 1 responses, but row 0 of the same data source 'arithmetic' has 2"):
        run_eval(eval_config(f"data.path={ragged}"))
    with pytest.raises(DataError, match="no column 'answers' \\(data.response_key\\)"):
        run_eval(eval_config(f"data.path={ragged}", "data.response_key=answers"))
    unscorable = write_generations(tmp_path / "unknown.parquet", [row("no/such/source", "1", ["#### 1"])])
    with pytest.raises(RewardFailure, match="1/1 reward computations failed"):
        run_eval(eval_config(f"data.path={unscorable}", "reward.num_workers=0"))


def test_command_lines(tmp_path):
    """The Hydra entries: main_eval end to end; main_generation refusing a mistyped key."""
    path = write_generations(tmp_path / "gen.parquet", [row("arithmetic", "5", ["#### 5"])])
    result = subprocess.run([sys.executable, "-m", "verlx.trainer.main_eval", f"data.path={path}",
                             "reward.num_workers=0"], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "arithmetic" in result.stdout and (tmp_path / "gen.eval.json").is_file()

    typo = subprocess.run([sys.executable, "-m", "verlx.trainer.main_generation", "data.n_sample=2"],
                          capture_output=True, text=True, cwd=tmp_path)
    assert typo.returncode == 2 and "unknown key 'data.n_sample'. Did you mean 'n_samples'?" in typo.stderr
