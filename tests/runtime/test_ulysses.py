"""Ulysses sequence parallelism on 2 gloo processes: SP=2 gives the log-probs, entropy, exact KL, values and
(summed over the SP group) parameter gradients of the unsplit packed model, in fp32; the actor's and critic's
token budgets count the tokens one GPU holds (veRL's *_max_token_len_per_gpu), a micro-batch budget × 2."""

from __future__ import annotations

import copy
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.models.ulysses import check_ulysses, kv_repeats
from verlx.utils.distributed import free_port


def _batch():
    """4 rows, 23 real tokens in all (odd: the packed row gets a 1-token pad tail to split over 2 ranks)."""
    g = torch.Generator().manual_seed(7)
    prompt, response = 6, 5
    ids = torch.randint(1, 61, (4, prompt + response), generator=g)
    mask = torch.zeros(4, prompt + response, dtype=torch.long)
    for i, (p, r) in enumerate([(6, 5), (2, 1), (4, 3), (1, 1)]):
        mask[i, prompt - p: prompt + r] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response


def _config(kv_heads: int):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                       attn_implementation="sdpa")


def _summed_grads(model, group) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        if p.grad is not None:
            grad = p.grad.clone()
            if group is not None:
                dist.all_reduce(grad, group=group)
            out[name] = grad
    return out


def _compare(want: dict, got: dict) -> None:
    assert want.keys() == got.keys() and len(want) > 5
    for name, expected in want.items():
        torch.testing.assert_close(got[name], expected, rtol=0, atol=1e-5 * expected.abs().max().item() + 1e-9,
                                   msg=name)


def _policy_case(kv_heads: int, group) -> None:
    from transformers import AutoModelForCausalLM

    from verlx.models.policy import PolicyModel

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(kv_heads)).float()
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    weights = torch.linspace(-1.0, 1.0, rmask.numel()).reshape(rmask.shape)
    results = []
    for sp_group in (None, group):
        model = PolicyModel(copy.deepcopy(hf), packed=True, sp_group=sp_group)
        lp, ent = model(ids, mask, pos, resp, temperature=0.9, chunk_size=3, with_entropy=True)
        ((lp * weights)[rmask].sum() + 0.5 * (ent * weights)[rmask].sum()).backward()
        results.append((lp.detach(), ent.detach(), _summed_grads(model, sp_group)))
    (lp_1, ent_1, g_1), (lp_2, ent_2, g_2) = results
    torch.testing.assert_close(lp_2, lp_1, rtol=0, atol=2e-6)
    torch.testing.assert_close(ent_2, ent_1, rtol=0, atol=2e-6)
    _compare(g_1, g_2)


def _full_kl_case(group) -> None:
    """The exact-KL path: the reference's response hidden states are gathered whole; the KL is split again."""
    from transformers import AutoModelForCausalLM

    from verlx.models.policy import PolicyModel

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(2)).float()
    ref = AutoModelForCausalLM.from_config(_config(2)).float()
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    results = []
    for sp_group in (None, group):
        reference = PolicyModel(copy.deepcopy(ref), packed=True, sp_group=sp_group)
        policy = PolicyModel(copy.deepcopy(hf), packed=True, sp_group=sp_group)
        ref_hidden, ref_weight = reference(ids, mask, pos, resp, return_response_hidden=True)
        _, _, kl = policy(ids, mask, pos, resp, chunk_size=4, kl_reference=(ref_hidden, ref_weight))
        kl[rmask].sum().backward()
        results.append((ref_hidden, kl.detach(), _summed_grads(policy, sp_group)))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=2e-6)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=0, atol=2e-6)
    assert results[0][1][rmask].min() > 0
    _compare(results[0][2], results[1][2])


def _value_case(group) -> None:
    from transformers import AutoModel

    from verlx.models.policy import ValueModel

    torch.manual_seed(0)
    decoder = AutoModel.from_config(_config(2)).float()
    ids, mask, pos, resp = _batch()
    rmask = mask[:, -resp:].bool()
    results = []
    for sp_group in (None, group):
        model = ValueModel(copy.deepcopy(decoder), 32, packed=True, sp_group=sp_group)
        torch.nn.init.normal_(model.value_head.weight, generator=torch.Generator().manual_seed(3), std=0.1)
        values = model(ids, mask, pos, resp)
        values[rmask].square().sum().backward()
        results.append((values.detach(), _summed_grads(model, sp_group)))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=0, atol=2e-6)
    _compare(results[0][1], results[1][1])


def _recording_engine(module):
    """The FSDP engine (forward passes on a plain module), noting the real lengths of each micro-batch it gets."""
    from verlx.workers.fsdp.engine import FSDPEngine

    class Recording(FSDPEngine):
        def forward(self, parts, head):
            self.seen = [p.batch["attention_mask"].sum(-1).tolist() for p in parts]
            return super().forward(parts, head)

    return Recording("model", module)


def _budget_case(group) -> None:
    """Rows of 11, 3, 7 and 2 tokens. A per-GPU budget of 12: one micro-batch of all 23 tokens for the SP pair
    (24 fit), two (11 | 3+7+2) on one GPU. A budget of 8, short of the 11-token row on one GPU, is enough for the pair
    (11 | 12 ≤ 16). Log-probs and values equal the unsplit model's either way."""
    from transformers import AutoModel, AutoModelForCausalLM

    from verlx.config.roles import ActorConfig, CriticConfig
    from verlx.models.policy import PolicyModel, ValueModel
    from verlx.protocol import DataProto
    from verlx.workers.actor import PPOActor
    from verlx.workers.critic import PPOCritic

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_config(2)).float()
    decoder = AutoModel.from_config(_config(2)).float()
    ids, mask, pos, resp = _batch()
    data = DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -resp:],
                      "response_mask": mask[:, -resp:]}, meta_info={"temperature": 0.9})

    def actor(sp: int, budget: int) -> PPOActor:
        policy = PolicyModel(copy.deepcopy(hf), packed=True, sp_group=group if sp > 1 else None)
        cfg = ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=budget, ulysses_sequence_parallel_size=sp)
        return PPOActor(cfg, _recording_engine(policy))

    def critic(sp: int, budget: int) -> PPOCritic:
        model = ValueModel(copy.deepcopy(decoder), 32, packed=True, sp_group=group if sp > 1 else None)
        torch.nn.init.normal_(model.value_head.weight, generator=torch.Generator().manual_seed(3), std=0.1)
        cfg = CriticConfig(use_dynamic_bsz=True, forward_max_token_len_per_gpu=budget,
                           ulysses_sequence_parallel_size=sp)
        return PPOCritic(cfg, _recording_engine(model))

    one = actor(1, 12)
    want, _ = one.compute_log_prob(data, None, True, 12)
    assert one.engine.seen == [[11], [3, 7, 2]]
    with pytest.raises(ValueError, match="log_prob_max_token_len_per_gpu=8 is smaller than the longest sequence"):
        one.compute_log_prob(data, None, True, 8)
    for budget, seen in ((12, [[11, 3, 7, 2]]), (8, [[11], [3, 7, 2]])):
        pair = actor(2, budget)
        got, _ = pair.compute_log_prob(data, None, True, budget)
        assert pair.engine.seen == seen, budget
        torch.testing.assert_close(got, want, rtol=0, atol=2e-6)
    single = critic(1, 16)
    want = single.compute_values(data, None)
    pair = critic(2, 8)
    torch.testing.assert_close(pair.compute_values(data, None), want, rtol=0, atol=2e-6)
    assert single.engine.seen == pair.engine.seen == [[11], [3, 7, 2]]


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        group = dist.new_group(list(range(world)))
        _policy_case(kv_heads=2, group=group)  # KV heads split 1 per rank
        _policy_case(kv_heads=1, group=group)  # 1 KV head replicated onto both ranks
        _full_kl_case(group)
        _value_case(group)
        _budget_case(group)
    finally:
        dist.destroy_process_group()


def test_sp2_matches_sp1_on_two_gloo_processes():
    mp.start_processes(_worker, args=(2, free_port()), nprocs=2, join=True, start_method="spawn")


def test_ulysses_size_checks_name_the_numbers():
    cfg = _config(2)
    check_ulysses(cfg, 2, 4)
    check_ulysses(_config(1), 4, 8)  # 1 KV head, replicated 4 times
    assert kv_repeats(2, 2) == 1 and kv_repeats(1, 4) == 4 and kv_repeats(2, 4) == 2
    with pytest.raises(ValueError, match=r"=3 must divide the world size 4"):
        check_ulysses(cfg, 3, 4)
    with pytest.raises(ValueError, match=r"=3 must divide the number of attention heads \(4\)"):
        check_ulysses(cfg, 3, 6)
    from transformers import Qwen2Config

    odd = Qwen2Config(hidden_size=48, num_attention_heads=12, num_key_value_heads=3)
    with pytest.raises(ValueError, match=r"=2 and the 3 key/value heads"):
        check_ulysses(odd, 2, 2)
