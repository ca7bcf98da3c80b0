"""torch.compile'd decoder layers and log-prob chunks on CPU (inductor + gcc): the same fp32 numbers as eager, one
compilation for every micro-batch size, checkpointing still recomputes, and a compiler error falls back to eager."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers.compile_models import assert_fp32_close, packed_batch, tiny_config, train_step

from verlx.models import compile as compile_mod
from verlx.models.compile import compile_model
from verlx.models.policy import PolicyModel


@pytest.fixture(scope="module")
def policies():
    from transformers import AutoModelForCausalLM

    from verlx.workers.fsdp.model_builder import enable_activation_checkpointing

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config()).float()
    enable_activation_checkpointing(hf)
    eager = PolicyModel(copy.deepcopy(hf), packed=True)
    compiled = PolicyModel(copy.deepcopy(hf), packed=True)
    assert compile_model(compiled) == 2 and compiled.compiled
    eager.train(), compiled.train()
    return eager, compiled


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
