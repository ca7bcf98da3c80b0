"""Remove-padding on a GPU in bf16: a fast varlen kernel is picked (or the reason it is not is printed), and the
packed model agrees with the padded SDPA model in value and gradient up to bf16 rounding."""

from __future__ import annotations

import copy

import pytest
import torch

from verlx.models.attention import FlashAttnVarlen, TorchVarlen, select_kernel
from verlx.models.policy import PolicyModel

pytestmark = pytest.mark.gpu


def _model(sliding_window=None):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                        sliding_window=sliding_window, attn_implementation="sdpa")
    torch.manual_seed(0)
    return MistralForCausalLM(cfg).cuda().to(torch.bfloat16)


def _batch():
    g = torch.Generator().manual_seed(0)
    prompt, response = 40, 90
    ids = torch.randint(0, 1000, (6, prompt + response), generator=g)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate([(40, 90), (3, 10), (25, 1), (17, 64), (1, 33), (30, 77)]):
        mask[i, prompt - p: prompt + r] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.cuda(), mask.cuda(), pos.cuda(), response


def test_a_fast_kernel_is_chosen_for_bf16():
    q = torch.zeros(4, 4, 64, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(4, 2, 64, device="cuda", dtype=torch.bfloat16)
    if FlashAttnVarlen().fn is None and TorchVarlen().fn is None:
        pytest.skip("neither flash_attn nor torch.nn.attention.varlen is available")
    kernel = select_kernel(q, k, None, 0.0)
    assert isinstance(kernel, (FlashAttnVarlen, TorchVarlen)), "see the warning above for why it was skipped"
    assert isinstance(select_kernel(q, k, 8, 0.0), (FlashAttnVarlen, TorchVarlen))


@pytest.mark.parametrize("window", [None, 16])
def test_packed_bf16_matches_padded(window):
    hf = _model(window)
    padded, packed = PolicyModel(hf), PolicyModel(copy.deepcopy(hf), packed=True)
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    results = []
    for model in (padded, packed):
        lp, ent = model(ids, mask, pos, resp, with_entropy=True)
        lp[rmask].sum().backward()
        grad = model.hf_model.model.layers[0].self_attn.q_proj.weight.grad.float()
        results.append((lp[rmask], ent[rmask], grad))
    (lp_a, ent_a, g_a), (lp_b, ent_b, g_b) = results
    assert (lp_a - lp_b).abs().mean() < 0.02 and (ent_a - ent_b).abs().mean() < 0.02
    assert (g_a - g_b).norm() / g_a.norm() < 0.05
