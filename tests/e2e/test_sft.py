"""SFT end to end on the tiny model: masked loss, loss going down, 1 vs 2 processes, the saved directory."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from arithmetic_rows import disjoint_pairs, write_arithmetic
from verlx.data.sft_dataset import collate, read_parquet_rows, tokenize_sft
from verlx.models.response_nll import ResponseNLL
from verlx.models.tiny import save_tiny_model
from verlx.trainer.sft_trainer import EpochBatches

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IM_END = 258


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


@pytest.fixture(scope="module")
def arithmetic_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("arith")
    train, test = disjoint_pairs(512, 64, seed=1)
    return (write_arithmetic(str(root / "train.parquet"), train, "train"),
            write_arithmetic(str(root / "test.parquet"), test, "test"))


def _tokenized(path: str, tokenizer) -> object:
    return tokenize_sft(
        read_parquet_rows(path), tokenizer, prompt_key="prompt", response_key="extra_info.answer",
        end_of_response_id=IM_END, max_length=512,
    )


def _direct_mean_response_nll(lm, data, rows) -> float:
    """Per row, unpadded: -log p(token t | tokens < t) summed over the response tokens t, over all rows' count."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            length, prompt = int(data.lengths[row]), int(data.prompt_lengths[row])
            ids = torch.from_numpy(data.input_ids[row, :length])[None]
            logp = F.log_softmax(lm(input_ids=ids).logits[0].double(), dim=-1)
            total -= sum(logp[t - 1, ids[0, t]].item() for t in range(prompt, length))
            count += length - prompt
    return total / count


def _run_sft(args: list[str], nproc: int = 1, timeout: int = 240) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = (launcher if nproc > 1 else [sys.executable]) + ["-m", "verlx.trainer.main_sft", *args]
    path = os.pathsep.join(p for p in [REPO, os.environ.get("PYTHONPATH", "")] if p)  # keep what is already there
    env = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _metrics(output_dir) -> list[dict]:
    with open(os.path.join(output_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def test_loss_is_the_mean_nll_of_response_tokens_only(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    path = write_arithmetic(str(tmp_path / "rows.parquet"), [(1, 2), (12, 34), (99, 9)], "train")
    data = _tokenized(path, tok)
    # prompt = 19 template tokens + the question: "1+2=?" 5 → 24, "12+34=?" 7 → 26, "99+9=?" 6 → 25
    assert data.prompt_lengths.tolist() == [24, 26, 25]
    # response = "#### " + answer + <|im_end|>: "#### 3" 6+1 = 7, "#### 46" 7+1 = 8, "#### 108" 8+1 = 9
    assert data.response_lengths.tolist() == [7, 8, 9]
    assert data.input_ids[1, 26:34].tolist() == [35, 35, 35, 35, 32, 52, 54, IM_END]  # "#### 46" + <|im_end|>
    lm = AutoModelForCausalLM.from_pretrained(tiny_dir)
    reference = _direct_mean_response_nll(lm, data, [0, 1, 2])
    batch = collate(data, np.array([0, 1, 2]), torch.device("cpu"))
    assert "attention_mask" in batch  # rows of different length are right-padded
    assert batch["targets"].numel() == 24
    for chunk in (4096, 5):  # one chunk, and several (the recomputed-logits path)
        with torch.no_grad():
            loss = ResponseNLL(lm, chunk_tokens=chunk)(**batch).item() / 24
        assert loss == pytest.approx(reference, rel=1e-5)
    assert abs(reference - math.log(259)) < 0.3  # an untrained model is near uniform over 259 tokens


def test_sft_lowers_loss_saves_a_loadable_model_and_reports_accuracy(tmp_path, tiny_dir, arithmetic_files):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    train, test = arithmetic_files
    out, logs = tmp_path / "sft", tmp_path / "logs"
    proc = _run_sft([
        f"data.train_files={train}", f"data.val_files={test}", f"model.partial_pretrain={tiny_dir}",
        f"trainer.default_local_dir={out}", f"trainer.output_dir={logs}", "trainer.total_training_steps=40",
        "trainer.log_freq=1", "data.train_batch_size=32", "data.micro_batch_size_per_gpu=16", "data.val_batch_size=32",
        "trainer.test_freq=-1", "trainer.target_val_accuracy=null",
    ])
    records = _metrics(logs)
    steps = [r for r in records if "val/accuracy" not in r]
    losses = [r["train/loss"] for r in steps]
    assert [r["step"] for r in steps] == list(range(1, 41))
    assert records[-1]["val/num_samples"] == 64 and 0.0 <= records[-1]["val/accuracy"] <= 1.0
    assert "val_acc" in proc.stdout

    # step 1's loss is the initial model's mean response NLL over the first global batch (seed 1, shuffled)
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    data = _tokenized(train, tok)
    first_batch = EpochBatches(len(data), 32, seed=1, shuffle=True)(0)
    initial = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert losses[0] == pytest.approx(_direct_mean_response_nll(initial, data, first_batch), rel=1e-4)
    assert abs(losses[0] - math.log(259)) < 0.3
    assert np.mean(losses[-5:]) < 1.3, losses  # ~5.56 → ~0.9 in 40 steps of 32 at lr 3e-3
    assert all(math.isfinite(r["train/grad_norm"]) and r["train/lr"] > 0 for r in steps[:-1])

    tuned = AutoModelForCausalLM.from_pretrained(str(out))
    assert sorted(os.listdir(out)) == sorted(
        ["chat_template.jinja", "config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
         "tokenizer_config.json"]
    )
    assert not any(name.startswith("sft.") for name in os.listdir(tmp_path))  # no temp/old dirs left behind
    assert not torch.equal(tuned.model.embed_tokens.weight, initial.model.embed_tokens.weight)
    assert tuned.generation_config.eos_token_id == [IM_END, 256]
    # after 40 steps the model answers in the trained format and ends its turn with <|im_end|>
    prompt = AutoTokenizer.from_pretrained(str(out)).apply_chat_template(
        [{"role": "user", "content": "23+45=?"}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    new = tuned.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False)[0, ids.shape[1]:]
    assert new[-1].item() == IM_END and tok.decode(new, skip_special_tokens=True).startswith("#### ")


def test_two_processes_follow_the_single_process_loss_curve(tmp_path, tiny_dir, arithmetic_files):
    """Same global batch of 16: one process (4 micro-batches of 4) vs two gloo processes (2 micro-batches each)."""
    from safetensors.torch import load_file

    train, _ = arithmetic_files
    common = [
        f"data.train_files={train}", "data.val_files=null", f"model.partial_pretrain={tiny_dir}",
        "trainer.total_training_steps=6", "trainer.log_freq=1", "data.train_batch_size=16",
        "data.micro_batch_size_per_gpu=4", "trainer.target_val_accuracy=null",
    ]
    runs = {}
    for nproc in (1, 2):
        out, logs = tmp_path / f"model{nproc}", tmp_path / f"logs{nproc}"
        proc = _run_sft([*common, f"trainer.default_local_dir={out}", f"trainer.output_dir={logs}"], nproc=nproc)
        assert f"{nproc} process(es) on cpu" in proc.stdout
        runs[nproc] = (_metrics(logs), load_file(str(out / "model.safetensors")))
    (one, weights_one), (two, weights_two) = runs[1], runs[2]
    for key in ("train/loss", "train/grad_norm", "train/lr"):
        np.testing.assert_allclose([r[key] for r in two], [r[key] for r in one], rtol=1e-4, err_msg=key)
    assert one[0]["train/loss"] - one[-1]["train/loss"] > 1.0  # the curve being compared actually moves
    assert weights_one.keys() == weights_two.keys()
    for name in weights_one:
        torch.testing.assert_close(weights_two[name], weights_one[name], rtol=1e-4, atol=1e-5, msg=name)


def test_training_stops_once_validation_reaches_the_target(tmp_path, tiny_dir, arithmetic_files):
    """target 0.0 is reached by the first validation (step 3 of 50): the run stops there and saves that model."""
    train, test = arithmetic_files
    out, logs = tmp_path / "sft", tmp_path / "logs"
    proc = _run_sft([
        f"data.train_files={train}", f"data.val_files={test}", f"model.partial_pretrain={tiny_dir}",
        f"trainer.default_local_dir={out}", f"trainer.output_dir={logs}", "trainer.total_training_steps=50",
        "trainer.log_freq=2", "trainer.test_freq=3", "trainer.target_val_accuracy=0.0", "data.train_batch_size=16",
    ])
    assert "reached trainer.target_val_accuracy=0.0 at step 3: stopping" in proc.stdout
    records = _metrics(logs)
    # step 2 (log_freq), step 3 (flushed before validating), the step-3 validation, the final record
    assert [r["step"] for r in records] == [2, 3, 3, 3]
    assert records[-1]["train/steps"] == 3 and records[-1]["val/num_samples"] == 64
    assert os.path.isfile(out / "model.safetensors")


@pytest.mark.gpu
def test_sft_on_one_gpu_bf16(tmp_path, tiny_dir, arithmetic_files):
    """The CUDA path (NCCL, bf16 compute, fp32 master weights) trains and saves like the CPU one."""
    train, test = arithmetic_files
    out, logs = tmp_path / "sft", tmp_path / "logs"
    proc = _run_sft([
        f"data.train_files={train}", f"data.val_files={test}", f"model.partial_pretrain={tiny_dir}",
        f"trainer.default_local_dir={out}", f"trainer.output_dir={logs}", "trainer.total_training_steps=40",
        "trainer.log_freq=1", "data.train_batch_size=32", "trainer.device=cuda", "trainer.target_val_accuracy=null",
    ])
    assert "1 process(es) on cuda" in proc.stdout
    losses = [r["train/loss"] for r in _metrics(logs) if "val/accuracy" not in r]
    assert abs(losses[0] - math.log(259)) < 0.3 and np.mean(losses[-5:]) < 1.3, losses
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(str(out)).dtype == torch.float32
