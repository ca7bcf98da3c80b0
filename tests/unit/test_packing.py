"""Remove-padding: packing arithmetic, and packed == padded (fp32) for log-probs, entropy, values and gradients."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

from verlx.models import attention
from verlx.models.attention import PACKED_ATTENTION, SdpaPerSequence, TorchVarlen
from verlx.models.packing import pack_batch, scatter_responses, unpack_tokens
from verlx.models.policy import PolicyModel, ValueModel

P, R = 5, 4


def _layout():
    """3 rows of [prompt 5 | response 4]; real prompt lengths 3, 5, 1 and real response lengths 2, 4, 1."""
    ids = torch.arange(1, 28).reshape(3, 9)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 1, 1, 1, 1, 1],
                         [0, 0, 0, 0, 1, 1, 0, 0, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def test_pack_layout_by_hand():
    ids, mask, pos = _layout()
    packed = pack_batch(ids, mask, pos, R)
    # row 0 keeps ids 3..7, row 1 keeps 10..18, row 2 keeps 23, 24 → 5 + 9 + 2 = 16 tokens
    assert packed.input_ids.tolist() == [[3, 4, 5, 6, 7, 10, 11, 12, 13, 14, 15, 16, 17, 18, 23, 24]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 5, 14, 16] and packed.cu_seqlens.dtype == torch.int32
    assert packed.seq_lens == (5, 9, 2) and packed.max_seqlen == 9 and packed.num_real_tokens == 16
    # response tokens 6, 7 | 15, 16, 17, 18 | 24, each predicted by the packed token just before it
    assert packed.response_targets.tolist() == [6, 7, 15, 16, 17, 18, 24]
    assert packed.predictor_index.tolist() == [2, 3, 9, 10, 11, 12, 14]
    # their places in the flattened [3 × 4] response grid: row 0 → 0, 1; row 1 → 4..7; row 2 → 8
    assert packed.response_index.tolist() == [0, 1, 4, 5, 6, 7, 8] and packed.response_shape == (3, 4)
    assert packed.input_ids[0, packed.predictor_index + 1].tolist() == packed.response_targets.tolist()


def test_pack_reads_the_host_mask_it_is_given_not_the_device_one():
    """The worker's batch is on the host before it moves to the device: packing reads that copy, so no device mask
    is copied back (a sync per micro-batch on a GPU). Meta tensors stand for device tensors that cannot be read."""
    ids, mask, pos = _layout()
    on_host = pack_batch(ids, mask, pos, R)
    device_ids, device_mask, device_pos = (t.to("meta") for t in (ids, mask, pos))
    packed = pack_batch(device_ids, device_mask, device_pos, R, host_mask=mask)
    assert packed.seq_lens == on_host.seq_lens == (5, 9, 2)
    assert torch.equal(packed.cu_seqlens_host, on_host.cu_seqlens_host) and packed.num_real_tokens == 16
    assert packed.input_ids.shape == (1, 16) and packed.input_ids.device.type == "meta"
    with pytest.raises(ValueError, match="host copy of attention_mask"):
        pack_batch(device_ids, device_mask, device_pos, R, host_mask=mask[:2])


def test_fsdp_engine_hands_packing_the_host_mask(monkeypatch):
    from transformers import AutoModelForCausalLM

    from verlx.models import policy
    from verlx.protocol import DataProto
    from verlx.workers.engine import Head
    from verlx.workers.fsdp.engine import FSDPEngine

    seen = []

    def spy(*args, host_mask=None, **kwargs):
        seen.append(host_mask)
        return pack_batch(*args, host_mask=host_mask, **kwargs)

    monkeypatch.setattr(policy, "pack_batch", spy)
    torch.manual_seed(0)
    model = PolicyModel(AutoModelForCausalLM.from_config(_config("qwen2")).float(), packed=True)
    ids, mask, pos, resp = _batch(seed=2)
    mb = DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -resp:]})
    out = FSDPEngine("actor", model).forward([mb], Head())[0]
    assert len(seen) == 1 and seen[0] is mask  # the micro-batch's own host tensor
    want, _ = model(ids, mask, pos, resp)
    torch.testing.assert_close(out["log_prob"], want, rtol=0, atol=0)


def test_pad_tail_for_sequence_parallel():
    ids, mask, pos = _layout()
    packed = pack_batch(ids, mask, pos, R, pad_multiple=6, pad_token_id=0)
    # 16 real tokens rounded up to 18: a 2-token tail segment of pad ids, positions 0, 1
    assert packed.input_ids.shape == (1, 18) and packed.input_ids[0, 16:].tolist() == [0, 0]
    assert packed.position_ids[0, 16:].tolist() == [0, 1]
    assert packed.cu_seqlens.tolist() == [0, 5, 14, 16, 18] and packed.seq_lens == (5, 9, 2, 2)


def test_unpack_round_trip_and_scatter():
    ids, mask, pos = _layout()
    packed = pack_batch(ids, mask, pos, R, pad_multiple=4)
    restored = unpack_tokens(packed.input_ids[0].float(), packed, ids.shape[1])
    assert torch.equal(restored, (ids * mask).float())
    values = torch.arange(1.0, 8.0)
    grid = scatter_responses(values, packed)
    assert grid.tolist() == [[1, 2, 0, 0], [3, 4, 5, 6], [7, 0, 0, 0]]


def test_pack_rejects_rows_without_prompt_and_misshapen_positions():
    ids, mask, pos = _layout()
    bad = mask.clone()
    bad[2, :P] = 0
    with pytest.raises(ValueError, match=r"rows \[2\] have no prompt token"):
        pack_batch(ids, bad, pos, R)
    with pytest.raises(ValueError, match=r"position_ids of shape \[batch, seq\] \(3, 9\) or \[batch, axes, seq\]"):
        pack_batch(ids, mask, pos[:, :8], R)


def test_pack_multi_axis_positions_axis_by_axis():
    """[B, C, T] positions (a vision-language batch's text and M-RoPE axes) pack to [1, C, T_packed]: each axis as
    a [B, T] one would, the pad tail counting from 0 on every axis."""
    ids, mask, pos = _layout()
    axes = torch.stack([pos, pos * 10, pos * 100], dim=1)
    packed = pack_batch(ids, mask, axes, R, pad_multiple=3)
    assert packed.position_ids.shape == (1, 3, 18)
    single = pack_batch(ids, mask, pos, R, pad_multiple=3).position_ids[0]
    assert single.tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0, 1, 0, 1]
    assert packed.position_ids[0].tolist() == [single.tolist(), (single[:16] * 10).tolist() + [0, 1],
                                               (single[:16] * 100).tolist() + [0, 1]]


# ------------------------------------------------------------------------------------------- models
def _config(family: str, **extra):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config

    cls = {"qwen2": Qwen2Config, "llama": LlamaConfig, "mistral": MistralConfig}[family]
    return cls(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=64, attn_implementation="sdpa", **extra)


def _batch(seed=0, batch=4, prompt=7, response=6, vocab=61):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (batch, prompt + response), generator=g)
    prompt_lens, response_lens = [7, 3, 5, 1], [6, 2, 1, 4]
    mask = torch.zeros(batch, prompt + response, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[i, prompt - p: prompt + r] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, response


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same_grads(a, b):
    """Equal up to fp32 rounding: 1e-5 of each tensor's largest entry (the sums run in a different order)."""
    assert a.keys() == b.keys() and len(a) > 5
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-5 * a[name].abs().max().item() + 1e-9,
                                   msg=name)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_policy_packed_equals_padded(family):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(family)).float()
    padded, packed = PolicyModel(hf), PolicyModel(copy.deepcopy(hf), packed=True)
    assert packed.config._attn_implementation == PACKED_ATTENTION
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    weights = torch.randn(ids.shape[0], resp, generator=torch.Generator().manual_seed(1))
    outs = []
    for model in (padded, packed):
        lp, ent = model(ids, mask, pos, resp, temperature=0.7, chunk_size=5, with_entropy=True)
        ((lp * weights)[rmask].sum() + (ent * weights)[rmask].sum()).backward()
        outs.append((lp, ent, _grads(model.hf_model)))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = outs
    torch.testing.assert_close(lp_b[rmask], lp_a[rmask], rtol=0, atol=2e-6)
    torch.testing.assert_close(ent_b[rmask], ent_a[rmask], rtol=0, atol=2e-6)
    assert (lp_b[~rmask] == 0).all() and (ent_b[~rmask] == 0).all()
    _assert_same_grads(g_a, g_b)


def test_policy_sum_pi_squared_equals_the_full_softmax_padded_and_packed():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config("qwen2")).float()
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    with torch.no_grad():
        logits = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -resp - 1:-1] / 0.7
        reference = torch.softmax(logits.double(), dim=-1).square().sum(-1)
        for model in (PolicyModel(hf), PolicyModel(copy.deepcopy(hf), packed=True)):
            lp, ent, spsq = model(ids, mask, pos, resp, temperature=0.7, chunk_size=5, with_sum_pi_squared=True)
            assert ent is None and lp.shape == spsq.shape
            torch.testing.assert_close(spsq[rmask].double(), reference[rmask], rtol=0, atol=1e-6)


def test_value_model_packed_equals_padded():
    from transformers import AutoModel

    torch.manual_seed(0)
    decoder = AutoModel.from_config(_config("qwen2")).float()
    padded = ValueModel(decoder, 32)
    torch.nn.init.normal_(padded.value_head.weight, std=0.1)
    packed = ValueModel(copy.deepcopy(decoder), 32, packed=True)
    packed.value_head.load_state_dict(padded.value_head.state_dict())
    ids, mask, pos, resp = _batch(seed=2)
    rmask = mask[:, -resp:].bool()
    outs = []
    for model in (padded, packed):
        values = model(ids, mask, pos, resp)
        values[rmask].square().sum().backward()
        outs.append((values, _grads(model)))
    torch.testing.assert_close(outs[1][0][rmask], outs[0][0][rmask], rtol=0, atol=2e-6)
    _assert_same_grads(outs[0][1], outs[1][1])


def test_full_kl_and_reference_hidden_packed_equal_padded():
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config("qwen2")).float()
    ref = AutoModelForCausalLM.from_config(_config("qwen2")).float()
    ids, mask, pos, resp = _batch(seed=3)
    rmask = mask[:, -resp:].bool()
    results = []
    for packed in (False, True):
        policy = PolicyModel(copy.deepcopy(hf), packed=packed)
        reference = PolicyModel(copy.deepcopy(ref), packed=packed)
        ref_hidden, ref_weight = reference(ids, mask, pos, resp, return_response_hidden=True)
        _, _, kl = policy(ids, mask, pos, resp, chunk_size=4, kl_reference=(ref_hidden, ref_weight))
        kl[rmask].sum().backward()
        results.append((ref_hidden, kl, _grads(policy.hf_model)))
    torch.testing.assert_close(results[1][0][rmask], results[0][0][rmask], rtol=0, atol=2e-6)
    torch.testing.assert_close(results[1][1][rmask], results[0][1][rmask], rtol=0, atol=2e-6)
    _assert_same_grads(results[0][2], results[1][2])


def test_gradient_checkpointing_keeps_packed_kwargs():
    from transformers import AutoModelForCausalLM

    from verlx.workers.fsdp.model_builder import enable_activation_checkpointing

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config("qwen2")).float()
    plain = PolicyModel(copy.deepcopy(hf), packed=True)
    ckpt_model = copy.deepcopy(hf)
    enable_activation_checkpointing(ckpt_model)
    ckpt = PolicyModel(ckpt_model, packed=True)
    ids, mask, pos, resp = _batch(seed=4)
    for model in (plain, ckpt):
        model.train()
        lp, _ = model(ids, mask, pos, resp)
        lp.sum().backward()
    _assert_same_grads(_grads(plain.hf_model), _grads(ckpt.hf_model))


def test_sliding_window_honoured():
    """Mistral with a 3-token window: packed (per-sequence banded SDPA) equals HF's padded sliding mask."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config("mistral", sliding_window=3)).float()
    full = AutoModelForCausalLM.from_config(_config("mistral", sliding_window=None)).float()
    full.load_state_dict(hf.state_dict())
    ids, mask, pos, resp = _batch(seed=5)
    rmask = mask[:, -resp:].bool()
    padded, _ = PolicyModel(hf)(ids, mask, pos, resp)
    packed, _ = PolicyModel(copy.deepcopy(hf), packed=True)(ids, mask, pos, resp)
    unwindowed, _ = PolicyModel(full, packed=True)(ids, mask, pos, resp)
    torch.testing.assert_close(packed[rmask], padded[rmask], rtol=0, atol=2e-6)
    assert (unwindowed[rmask] - padded[rmask]).abs().max() > 1e-3  # the window changes the answer


def test_packed_model_still_serves_padded_calls():
    """The registered implementation falls through to SDPA with a 2-D mask (e.g. HF generation on that model)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config("qwen2")).float()
    switched = PolicyModel(copy.deepcopy(hf), packed=True).hf_model
    ids, mask, pos, _ = _batch(seed=6)
    want = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    got = switched(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=0, atol=2e-6)


def test_ulysses_needs_packing():
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_config(_config("qwen2"))
    with pytest.raises(ValueError, match="needs packed sequences"):
        PolicyModel(hf, sp_group=object())


# ------------------------------------------------------------------------------------------- kernels
def _qkv(lengths, heads=4, kv_heads=2, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    return (torch.randn(total, heads, dim, generator=g), torch.randn(total, kv_heads, dim, generator=g),
            torch.randn(total, kv_heads, dim, generator=g))


def _dense_reference(q, k, v, lengths, window=None):
    """Block-diagonal causal (optionally windowed) attention over the whole packed row, written out densely."""
    seg = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    i = torch.arange(q.shape[0])
    allowed = (seg[:, None] == seg[None, :]) & (i[None, :] <= i[:, None])
    if window is not None:
        allowed &= i[None, :] > i[:, None] - window
    rep = q.shape[1] // k.shape[1]
    scores = torch.einsum("thd,shd->hts", q, k.repeat_interleave(rep, 1)) * q.shape[-1] ** -0.5
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    return torch.einsum("hts,shd->thd", probs, v.repeat_interleave(rep, 1))


@pytest.mark.parametrize("window", [None, 3])
def test_sdpa_per_sequence_matches_dense_block_causal(window):
    lengths = [4, 7, 1, 5]
    q, k, v = _qkv(lengths)
    cu = torch.tensor([0, 4, 11, 12, 17], dtype=torch.int32)
    out = SdpaPerSequence()(q, k, v, cu, 7, lengths, 8 ** -0.5, window, 0.0)
    torch.testing.assert_close(out, _dense_reference(q, k, v, lengths, window), rtol=0, atol=1e-6)


def _fake_varlen_attn_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                           window_size=(-1, -1)):
    """torch 2.11's varlen_attn contract on CPU: causal only for the tuple (-1, 0), (W, 0) = W tokens back, no GQA."""
    if query.shape[1] != key.shape[1]:
        raise ValueError("Expect query and key/value to have the same number of heads")
    is_causal = window_size == (-1, 0)
    lengths = cu_seq_q.diff().tolist()
    if is_causal:
        return _dense_reference(query, key, value, lengths)
    if window_size[1] == 0 and window_size[0] >= 0:
        return _dense_reference(query, key, value, lengths, window=window_size[0] + 1)
    raise AssertionError(f"non-causal window {window_size}")


@pytest.mark.parametrize("window", [None, 3])
def test_torch_varlen_adapter_against_the_2_11_signature(window):
    """The adapter repeats KV heads (no enable_gqa), passes causal as the tuple (-1, 0), windows as (w - 1, 0)."""
    kernel = TorchVarlen(_fake_varlen_attn_2_11)
    assert not kernel.has_gqa and kernel.has_window
    lengths = [4, 7, 5]
    q, k, v = _qkv(lengths, seed=1)
    cu = torch.tensor([0, 4, 11, 16], dtype=torch.int32)
    out = kernel(q, k, v, cu, 7, lengths, 8 ** -0.5, window, 0.0)
    torch.testing.assert_close(out, _dense_reference(q, k, v, lengths, window), rtol=0, atol=1e-6)
    assert "needs CUDA" in kernel.unusable_reason(q, window, 0.0)


def test_torch_varlen_on_this_torch_is_inspected():
    kernel = TorchVarlen()
    if kernel.fn is None:
        assert "varlen" in kernel.missing
    else:  # torch 2.13 here: window_size and enable_gqa
        assert kernel.has_window and kernel.has_gqa


def test_broken_or_wrong_kernels_fail_over_to_the_reference(monkeypatch, caplog):
    q, k, _ = _qkv([3, 6], seed=2)

    @attention.VARLEN_KERNELS.register("test_raises", override=True)
    class Raises:
        probe = True

        def unusable_reason(self, q, window, dropout):
            return None

        def __call__(self, *args):
            raise RuntimeError("no kernel image for this device")

    @attention.VARLEN_KERNELS.register("test_not_causal", override=True)
    class NotCausal(Raises):
        def __call__(self, q, k, v, cu, max_len, seq_lens, scale, window, dropout):
            return F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                  scale=scale, enable_gqa=True).transpose(0, 1)

    monkeypatch.setattr(attention, "KERNEL_PREFERENCE", ("test_raises", "test_not_causal", "sdpa_per_sequence"))
    monkeypatch.setattr(attention, "_probe_results", {})
    monkeypatch.setattr(attention, "_instances", {})
    with caplog.at_level(logging.WARNING, logger="verlx.models.attention"):
        chosen = attention.select_kernel(q, k, None, 0.0)
    assert isinstance(chosen, SdpaPerSequence)
    assert "test_raises skipped" in caplog.text and "no kernel image" in caplog.text
    assert "test_not_causal skipped" in caplog.text and "disagrees with SDPA" in caplog.text
    attention.force_kernel("test_raises")
    try:
        with pytest.raises(RuntimeError, match="no usable varlen attention kernel"):
            attention.select_kernel(q, k, None, 0.0)
    finally:
        attention.force_kernel(None)
