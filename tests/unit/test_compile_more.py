"""torch.compile on CPU, continued: the value model, eval forwards, the fallback to eager on a compiler error, and
the compiled log-prob chunks against an fp64 reference (a file of its own: inductor's CPU builds are slow)."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.compile_models import assert_fp32_close, grads, packed_batch, tiny_config, train_step
from verlx.models import compile as compile_mod
from verlx.models.chunked_logprob import chunked_log_probs
from verlx.models.compile import compile_model
from verlx.models.policy import PolicyModel, ValueModel


def test_compiled_value_model_and_eval_forward():
    from transformers import AutoModel

    torch.manual_seed(1)
    decoder = AutoModel.from_config(tiny_config()).float()
    eager = ValueModel(decoder, 32, packed=True)
    torch.nn.init.normal_(eager.value_head.weight, std=0.1)
    compiled = copy.deepcopy(eager)
    compile_model(compiled)
    ids, mask, pos, resp = packed_batch(4, 3)
    rmask = mask[:, -resp:].bool()
    results = []
    for model in (eager, compiled):
        values = model(ids, mask, pos, resp)
        values[rmask].square().sum().backward()
        results.append((values.detach(), grads(model)))
    assert_fp32_close(results[0][0], results[1][0], "values")
    for name in results[0][1]:
        assert_fp32_close(results[0][1][name], results[1][1][name], name)
    from transformers import AutoModelForCausalLM

    eager_policy = PolicyModel(AutoModelForCausalLM.from_config(tiny_config()).float(), packed=True).eval()
    compiled_policy = copy.deepcopy(eager_policy)
    compile_model(compiled_policy)
    with torch.no_grad():  # an eval forward (log-probs for the old policy): no autograd graph, same numbers
        want, _ = eager_policy(ids, mask, pos, resp)
        got, _ = compiled_policy(ids, mask, pos, resp)
    assert_fp32_close(want, got, "eval log-probs")


def test_compiler_error_falls_back_to_eager(monkeypatch, caplog):
    from transformers import AutoModelForCausalLM

    def broken(forward):
        def raise_(*args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("inductor is unhappy")
        return raise_

    monkeypatch.setattr(compile_mod, "_compiled", broken)
    monkeypatch.setattr(compile_mod, "_failed", [])
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(tiny_config()).float()
    eager = PolicyModel(copy.deepcopy(hf), packed=True)
    model = PolicyModel(copy.deepcopy(hf), packed=True)
    compile_model(model)
    batch = packed_batch(5, 3)
    with caplog.at_level("WARNING"):
        want, got = train_step(eager, batch), train_step(model, batch)
    assert_fp32_close(want[0], got[0], "log-probs")  # the layers ran eagerly (log-prob chunks stay compiled)
    assert compile_mod.compile_failure() == "TorchDynamoException: inductor is unhappy"
    assert sum("running the decoder layers eagerly" in r.message for r in caplog.records) == 1


@pytest.mark.parametrize("with_entropy", [False, True])
def test_compiled_log_prob_chunks_match_fp64_like_eager(with_entropy):
    """Both paths within fp32 rounding of the fp64 full-logits reference (values and both input gradients)."""
    from verlx.models.chunked_logprob import full_logits_log_probs

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 16, generator=g, requires_grad=True)
    weight = torch.randn(37, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 37, (11,), generator=g)
    upstream = torch.randn(2, 11, generator=g)

    def run(fn, h, w):
        lp, ent = fn(h, w)
        loss = (lp * upstream[0].to(lp.dtype)).sum()
        if with_entropy:
            loss = loss + (ent * upstream[1].to(ent.dtype)).sum()
        return (lp, ent, *torch.autograd.grad(loss, (h, w)))

    h64, w64 = (t.detach().double().requires_grad_() for t in (hidden, weight))
    ref = run(lambda h, w: full_logits_log_probs(h, w, targets, 0.7, with_entropy), h64, w64)
    for compiled in (False, True):
        got = run(lambda h, w, c=compiled: chunked_log_probs(h, w, targets, 0.7, 4, with_entropy, compiled=c),
                  hidden, weight)
        for name, want, have in zip(("logp", "entropy", "d hidden", "d weight"), ref, got):
            if want is not None:
                torch.testing.assert_close(have.detach().double(), want.detach(), rtol=0,
                                           atol=3e-6 * max(want.abs().max().item(), 1.0),
                                           msg=f"{name} (compiled={compiled})")
