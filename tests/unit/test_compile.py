"""torch.compile'd decoder layers on CPU (inductor + gcc), compiled first and then sharded with FSDP2 as the
workers do: the same fp32 numbers as eager, one compilation for every micro-batch size, and activation
checkpointing still recomputes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from helpers.compile_models import assert_fp32_close, packed_batch, tiny_config, train_step
from verlx.models import compile as compile_mod
from verlx.models.compile import compile_model
from verlx.models.policy import PolicyModel
from verlx.utils.distributed import free_port


@pytest.fixture(scope="module")
def policies():
    """Eager and compiled copies of one model, each sharded by FSDP2 on a 1-rank gloo group (fp32)."""
    from transformers import AutoModelForCausalLM

    from verlx.workers.fsdp.model_builder import apply_fsdp2, enable_activation_checkpointing

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config()).float()
    enable_activation_checkpointing(hf)
    eager = PolicyModel(copy.deepcopy(hf), packed=True)
    compiled = PolicyModel(copy.deepcopy(hf), packed=True)
    assert compile_model(compiled) == 2 and compiled.compiled
    compiled.compiled = False  # the log-prob chunks have their own test (test_compile_more): fewer CPU builds here
    for model in (eager, compiled):
        apply_fsdp2(model, torch.device("cpu"), torch.float32)
        model.train()
    yield eager, compiled
    dist.destroy_process_group()


def test_compiled_policy_equals_eager_without_recompiling(policies, monkeypatch):
    eager, compiled = policies
    calls = []
    run = compile_mod._run
    monkeypatch.setattr(compile_mod, "_run", lambda *a, **k: calls.append(1) or run(*a, **k))
    # rows 3, 5, 4: packed lengths differ; chunk 4 never leaves a 1-token last chunk for these batches
    for i, batch in enumerate([packed_batch(1, 3), packed_batch(2, 5), packed_batch(3, 4)]):
        want = train_step(eager, batch)
        if i == 0:
            got = train_step(compiled, batch)
        else:  # later micro-batches of other lengths reuse the first compilation
            with torch._dynamo.config.patch(error_on_recompile=True):
                got = train_step(compiled, batch)
        assert_fp32_close(want[0], got[0], "log-probs")
        assert want[2].keys() == got[2].keys() and len(want[2]) > 5
        for name in want[2]:
            assert_fp32_close(want[2][name], got[2][name], name)
    # checkpointing wraps the compiled forward: every layer runs twice per step (forward, then the recompute)
    assert len(calls) == 3 * 2 * 2
    assert compile_mod.compile_failure() is None
