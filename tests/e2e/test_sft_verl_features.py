"""veRL's SFT features on verlx's trainer, end to end on the tiny model: conversations (messages data) trained on
their assistant turns, Ulysses sequence parallelism over two gloo processes, token-budget micro-batches, packed
micro-batches, LoRA, and save_freq checkpoints. Each run is `python -m verlx.trainer.sft_trainer` as veRL 0.9.1
users call it (its defaults: conversations, token budget, no padding)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import torch.nn.functional as F

from verlx.models.tiny import save_tiny_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _conversation(a: int, b: int) -> list[dict]:
    return [{"role": "user", "content": f"{a}+{b}=?"}, {"role": "assistant", "content": f"#### {a + b}"},
            {"role": "user", "content": "twice?"}, {"role": "assistant", "content": f"#### {2 * (a + b)}"}]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("conversations")
    rng = np.random.default_rng(3)
    pairs = rng.integers(0, 100, size=(40, 2)).tolist()
    for name, rows in (("train", pairs[:32]), ("test", pairs[32:])):
        pq.write_table(pa.Table.from_pylist([{"messages": _conversation(a, b)} for a, b in rows]),
                       str(root / f"{name}.parquet"))
    return str(root / "train.parquet"), str(root / "test.parquet"), save_tiny_model(str(root / "tiny"), seed=0)


def _run(args: list[str], nproc: int = 1, expect: int = 0) -> subprocess.CompletedProcess:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    cmd = (launcher if nproc > 1 else [sys.executable]) + ["-m", "verlx.trainer.sft_trainer", *args]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in [REPO, os.environ.get("PYTHONPATH", "")] if p),
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == expect, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def _metrics(logs) -> list[dict]:
    with open(os.path.join(logs, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def _common(files, tmp_path, name: str) -> list[str]:
    train, test, model = files
    return [f"data.train_files={train}", f"data.val_files={test}", f"model.path={model}", "data.train_batch_size=8",
            "trainer.total_training_steps=3", "trainer.log_freq=1", "trainer.logger=[console,file]",
            "optim.lr=1e-3", "trainer.device=cpu", f"trainer.default_local_dir={tmp_path / name}",
            f"trainer.output_dir={tmp_path / (name + '_logs')}"]


def _first_batch_assistant_nll(files) -> float:
    """The mean NLL of the assistant tokens (reply and end of turn) of step 1's 8 conversations, computed directly
    from each whole conversation with the untrained model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verlx.trainer.sft_trainer import EpochBatches

    train, _, model_dir = files
    tok, lm = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
    rows = pq.read_table(train).column("messages").to_pylist()
    total, count = 0.0, 0
    for row in EpochBatches(len(rows), 8, seed=1, shuffle=True)(0):
        messages = rows[row]
        ids = tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = F.log_softmax(lm(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)
        for i in (1, 3):  # the assistant turns: from after the generation prompt to the end of their turn
            start = len(tok(tok.apply_chat_template(messages[:i], tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)["input_ids"])
            end = len(tok(tok.apply_chat_template(messages[: i + 1], tokenize=False),
                          add_special_tokens=False)["input_ids"])
            total -= sum(logp[t - 1, ids[t]].item() for t in range(start, end))
            count += end - start
    return total / count


@pytest.mark.slow
def test_conversations_train_on_their_assistant_turns_and_ulysses_follows_one_process(tmp_path, files):
    """The same 3 steps: one process with padded fixed micro-batches, one process packed with a token budget, and
    a Ulysses pair (2 gloo processes, each half of every packed micro-batch): one loss curve."""
    from safetensors.torch import load_file

    runs = {
        "padded": (1, ["model.use_remove_padding=false", "data.use_dynamic_bsz=false",
                       "data.micro_batch_size_per_gpu=3"]),
        "packed": (1, ["data.max_token_len_per_gpu=300"]),
        "ulysses": (2, ["engine.ulysses_sequence_parallel_size=2", "data.max_token_len_per_gpu=150"]),
    }
    results = {}
    for name, (nproc, extra) in runs.items():
        proc = _run([*_common(files, tmp_path, name), *extra], nproc=nproc)
        assert f"{nproc} process(es) on cpu" in proc.stdout
        results[name] = (_metrics(tmp_path / f"{name}_logs"), load_file(str(tmp_path / name / "model.safetensors")))
    reference, weights = results["padded"]
    assert reference[0]["train/loss"] == pytest.approx(_first_batch_assistant_nll(files), rel=1e-5)
    assert reference[0]["train/loss"] - reference[2]["train/loss"] > 0.5  # the compared curve moves
    for name in ("packed", "ulysses"):
        records, other = results[name]
        for key in ("train/loss", "train/grad_norm", "val/loss"):
            np.testing.assert_allclose([r[key] for r in records if key in r], [r[key] for r in reference if key in r],
                                       rtol=2e-4, err_msg=f"{name} {key}")
        for tensor in weights:
            torch.testing.assert_close(other[tensor], weights[tensor], rtol=2e-4, atol=2e-5, msg=f"{name} {tensor}")


@pytest.mark.slow
def test_lora_trains_adapters_only_and_saves_the_merged_model(tmp_path, files):
    from safetensors.torch import load_file

    _run([*_common(files, tmp_path, "lora"), "model.lora_rank=4", "model.lora_alpha=8",
          "model.target_modules=[q_proj,v_proj]", "optim.lr=1e-2"])
    losses = [r["train/loss"] for r in _metrics(tmp_path / "lora_logs")]
    assert losses[2] < losses[0]
    base = load_file(os.path.join(files[2], "model.safetensors"))
    tuned = load_file(str(tmp_path / "lora" / "model.safetensors"))
    assert tuned.keys() == base.keys()  # plain HF names: the adapters are merged in
    changed = sorted(k for k in base if not torch.equal(base[k], tuned[k]))
    layers = len({k.split(".")[2] for k in base if k.startswith("model.layers.")})
    assert changed == sorted(f"model.layers.{i}.self_attn.{p}_proj.weight" for i in range(layers) for p in "qv")


@pytest.mark.slow
def test_save_freq_keeps_the_newest_steps_and_resume_auto_refuses_to_train_over_them(tmp_path, files):
    from safetensors.torch import load_file

    args = [*_common(files, tmp_path, "saved"), "trainer.save_freq=1", "trainer.max_ckpt_to_keep=2"]
    _run(args)
    root = tmp_path / "saved"
    assert sorted(p for p in os.listdir(root) if p.startswith("global_step_")) == ["global_step_2", "global_step_3"]
    final = load_file(str(root / "model.safetensors"))
    last = load_file(str(root / "global_step_3" / "model.safetensors"))
    assert all(torch.equal(final[k], last[k]) for k in final)
    again = _run(args, expect=2)
    assert "holds global_step_3 (trainer.save_freq's models) and trainer.resume_mode=auto" in again.stderr
