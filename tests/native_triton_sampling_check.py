"""The fused triton sampler against the torch sampler (sampling.sample_tokens, the reference).

As a script with TRITON_INTERPRET=1 (tests/unit/test_native_triton.py runs it) it checks on CPU through the
Triton interpreter and prints OK; test_native_engine_gpu.py calls the same checks on CUDA.
"""

from __future__ import annotations

import os

import torch

import native_triton_check  # noqa: F401  (patches the Triton interpreter when TRITON_INTERPRET=1)
from native_models import EOS, ragged_prompts, rollout_context, save_tiny_model, with_meta
from sampling_checks import VOCAB, plan, planted_row
from verlx.rollout.native.engine import NativeEngine
from verlx.rollout.native.sampling import sample_tokens
from verlx.rollout.native.slots import SlotState
from verlx.rollout.native.triton_sampling import TritonSampler
from verlx.rollout.seeds import row_seed


def _rows(count: int, device, dtype, scale: float = 3.0):
    gen = torch.Generator().manual_seed(count)
    logits = (planted_row() + torch.randn(count, VOCAB, generator=gen) * scale).to(device, dtype)
    seeds = torch.tensor([row_seed(3, i) for i in range(count)], device=device)
    steps = (torch.arange(count, device=device) * 5) % 11
    return logits, seeds, steps


def check_matches_reference(device=torch.device("cpu"), dtype=torch.float16, rows: int = 24) -> None:
    """Same tokens as sample_tokens for greedy, T = 1, T = 0.6 and blocked stop ids (one of them the likeliest
    id of some rows), whatever the launch layout; log-probs equal log_softmax(logits / T) to float32 rounding."""
    logits, seeds, steps = _rows(rows, device, dtype)
    stop = torch.unique(torch.cat([logits.float().argmax(-1)[:3], torch.tensor([VOCAB - 1], device=device)]))
    cases = [plan(greedy=True), plan(1.0), plan(0.6), plan(1.0, stop=stop.tolist(), min_new_tokens=6),
             plan(greedy=True, stop=stop.tolist(), min_new_tokens=6)]
    for case in cases:
        want, _ = sample_tokens(logits, case, stop, seeds, steps)
        reference = torch.log_softmax(logits.float() * (1.0 / case.temperature), dim=-1)
        for programs_per_row_hint in (1, 64):  # one statistics program per row, or one per group
            sampler = TritonSampler(device)
            sampler.num_sms = programs_per_row_hint * rows // 8 or 1
            tokens, logprobs = sampler.sample(logits, case, stop, seeds, steps)
            assert torch.equal(tokens, want), f"{case}: {tokens.tolist()} != {want.tolist()}"
            expected = reference.gather(1, tokens[:, None]).squeeze(1)
            torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)
        if case.min_new_tokens:
            blocked = steps < case.min_new_tokens
            assert not torch.isin(tokens[blocked], stop).any()


def check_fused_step(device=torch.device("cpu"), dtype=torch.float16) -> None:
    """SlotState.advance through the fused finish kernel leaves every buffer as the torch bookkeeping does.
    Rows (generated so far / state): 0: 3; 1: 2, peaked on the stop id but before min_new_tokens=4, so it
    must pick another id; 2: 5, peaked on the stop id, so it stops; 3: 11 of max 12, so it ends by length;
    4: already done (writes into the spare column, does not advance); 5: 7."""
    batch, response_len, stop = 6, 12, 1030
    logits, seeds, _ = _rows(batch, device, dtype, scale=0.5)
    logits[:, stop] = -10.0
    logits[1:3, stop] = 30.0
    for case in (plan(greedy=True, stop=(stop,), min_new_tokens=4), plan(0.7, stop=(stop,), min_new_tokens=4)):
        case = type(case)(**{**case.__dict__, "max_new_tokens": response_len})
        states = {}
        for name, sampler in (("torch", None), ("triton", TritonSampler(device))):
            state = SlotState(8, response_len, pad_token_id=0, device=device, sampler=sampler)
            state.seeds[:batch] = seeds
            state.gen_len[:batch] = torch.tensor([3, 2, 5, 11, 0, 7])
            state.pos[:batch] = state.gen_len[:batch] + 20
            state.done[:batch] = torch.tensor([False, False, False, False, True, False])
            state.advance(logits, case, batch)
            states[name] = state
        a, b = states["torch"], states["triton"]
        for field in ("tokens", "pos", "gen_len", "done", "out_tokens"):
            left, right = getattr(a, field), getattr(b, field)
            assert torch.equal(left, right), f"{field}: {left} vs {right}"
        torch.testing.assert_close(a.out_logprobs, b.out_logprobs, atol=1e-5, rtol=0)
        assert a.done.tolist()[:batch] == [False, False, True, True, True, False]
        assert a.gen_len.tolist()[:batch] == [4, 3, 6, 12, 0, 8]
        assert a.out_tokens[2, 5] == stop and a.tokens[1] != stop
        assert a.out_tokens[4, response_len] == a.tokens[4] and (a.out_tokens[4, :response_len] == 0).all()


def check_engine(tmp_dir: str) -> None:
    """NativeEngine with sampler=triton generates what sampler=torch generates (float32 tiny Qwen2, 8 rows
    through 5 slots, stop ids, min_new_tokens, n = 2; sampled and greedy): same tokens and lengths, log-probs
    equal to rounding."""
    _, config = save_tiny_model("qwen2", tmp_dir)
    prompts = ragged_prompts(4, 12, seed=6)
    outputs = {}
    for name in ("torch", "triton"):
        ctx = rollout_context(tmp_dir, config, max_num_seqs=5, eos=(EOS, 17, 40), response_length=16,
                              engine_kwargs={"native": {"sampler": name}})
        engine = NativeEngine(ctx)
        assert engine.sampler.name == name
        outputs[name] = [engine.generate(with_meta(prompts, **meta)) for meta in (
            dict(n=2, temperature=0.7, min_new_tokens=3, seed=3), dict(do_sample=False, max_new_tokens=10))]
    for a, b in zip(outputs["torch"], outputs["triton"]):
        assert torch.equal(a.batch["responses"], b.batch["responses"])
        assert torch.equal(a.batch["response_mask"], b.batch["response_mask"])
        torch.testing.assert_close(a.batch["rollout_log_probs"], b.batch["rollout_log_probs"], atol=1e-5, rtol=0)
    lengths = outputs["torch"][0].batch["response_mask"].sum(-1)
    assert lengths.min() < 16 and lengths.max() == 16  # some rows stopped early, so slots were refilled


if __name__ == "__main__":
    import tempfile

    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1 (or call the checks on a GPU)"
    for dtype in (torch.float16, torch.bfloat16):  # float32 logits: check_engine
        check_matches_reference(dtype=dtype)
    check_fused_step()
    with tempfile.TemporaryDirectory() as tmp:
        check_engine(tmp)
    print("OK")
