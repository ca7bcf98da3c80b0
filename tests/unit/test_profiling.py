"""Phase profiles on demand (VERLX_PROFILE_*): only the asked call of the asked phase is traced, and the summary counts
the actor update's micro-batches, optimizer steps and host synchronisations (CPU: a plain PolicyModel on an
FSDPEngine, the trainer's update loop)."""

from __future__ import annotations

import json

import pytest
import torch

from helpers.ppo_batches import ragged_ppo_batch
from verlx.workers import profiling
from verlx.workers.perf import PhaseTimer

CPU = torch.device("cpu")


def _actor():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.config.roles import ActorConfig
    from verlx.models.policy import PolicyModel
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import build_optimizer

    cfg = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = PolicyModel(Qwen2ForCausalLM(cfg).float(), packed=True)
    actor_cfg = ActorConfig(ppo_mini_batch_size=4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40)
    return PPOActor(actor_cfg, FSDPEngine("actor", model, build_optimizer(model.parameters(), actor_cfg.optim)))


@pytest.fixture
def profile_env(tmp_path, monkeypatch):
    monkeypatch.setattr(profiling, "_calls", profiling.Counter())
    monkeypatch.setenv(profiling.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(profiling.PHASES_ENV, "actor")
    monkeypatch.setenv(profiling.CALLS_ENV, "2")
    return tmp_path


def test_the_second_update_is_profiled_with_its_micro_batches_and_host_syncs(profile_env):
    actor = _actor()
    for step in range(3):
        data = ragged_ppo_batch(step, rows=8, token_range=(1, 61), meta_info={"temperature": 1.0})
        with PhaseTimer(CPU, "actor").measure():
            actor.update_policy(data, 4, None)  # two mini-batches of 4 rows
        with PhaseTimer(CPU, "actor_infer").measure():  # a phase not asked for
            actor.compute_log_prob(data, None, True, 40)
    assert sorted(p.name for p in profile_env.iterdir()) == ["actor_call2_rank0.json",
                                                             "actor_call2_rank0_summary.json"]
    summary = json.loads((profile_env / "actor_call2_rank0_summary.json").read_text())
    assert (summary["phase"], summary["call"], summary["rank"]) == ("actor", 2, 0)
    assert summary["optimizer_steps"] == 2
    parts = sum(1 for _ in actor.engine.module.parameters())
    assert summary["micro_batches"] >= 2 and summary["kernels"] == 0 and summary["device_busy_s"] == 0  # CPU
    # per micro-batch: pack_batch's two index nonzero() on the host copy of the mask the worker's batch already is
    # (host work, no device sync); transformers' packed-sequence check in create_causal_mask (bool() of a device
    # tensor: a sync on a GPU) is skipped by the prepared mask packed calls pass; per optimizer step: the
    # finite-norm check, and foreach AdamW on the CPU reads each parameter's step count twice (fused AdamW on a GPU
    # does not); per token-budget micro-batch, DataProto's indexing checks its index range (two reads of a host
    # tensor, before the micro-batch's marker)
    ops = summary["sync_ops"]
    assert ops["aten::nonzero"] == 2 * summary["micro_batches"]
    assert "aten::is_nonzero" not in ops
    assert ops["aten::_local_scalar_dense"] == 2 * (2 * parts + 1) + 2 * summary["micro_batches"]
    assert summary["sync_ops_per_micro_batch"] == 2.0
    assert summary["host_syncs"] == {} and summary["host_syncs_per_micro_batch"] == 0.0  # no CUDA runtime here
    trace = json.loads((profile_env / "actor_call2_rank0.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {profiling.MICRO_BATCH, profiling.OPTIMIZER_STEP} <= names


def test_busy_time_is_the_union_of_kernel_intervals():
    # [0, 10] and [5, 20] overlap: 20 µs; [30, 35]: 5 µs more
    assert profiling._union_seconds([(5.0, 20.0), (0.0, 10.0), (30.0, 35.0)]) == pytest.approx(25e-6)
    assert profiling._union_seconds([]) == 0.0


def test_nothing_is_profiled_without_the_directory(tmp_path, monkeypatch):
    monkeypatch.delenv(profiling.DIR_ENV, raising=False)
    assert type(profiling.phase_profile("actor", 0, CPU)).__name__ == "nullcontext"
