"""A Qwen2 checkpoint whose next token is known in closed form, for checking engines on a GPU.

Attention and MLP outputs are zeroed (o_proj, down_proj = 0), so the residual stream stays the embedding, which is
e0 (1 in coordinate 0) for every token. The final RMSNorm turns it into e0 / sqrt(1/H + eps), and lm_head row
k = C * e0 gives logit L = C / sqrt(1/H + eps) (≈ C sqrt(H)) to token k and 0 to all others, whatever the context.
So greedy decoding emits k forever and, at temperature T, log p(k) = L/T - log(exp(L/T) + V - 1) and
log p(other) = -log(exp(L/T) + V - 1).
"""

from __future__ import annotations

import math
import os

import torch

VOCAB, HIDDEN, HEADS, KV_HEADS = 256, 256, 4, 2  # head_dim 64: supported by every attention backend
C, EPS = 0.25, 1e-6
LOGIT = C / math.sqrt(1 / HIDDEN + EPS)  # 3.9995
EOS, PAD = 1, 0


def constant_model(k: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=512,
                         tie_word_embeddings=False, rms_norm_eps=EPS, eos_token_id=EOS, pad_token_id=PAD,
                         bos_token_id=EOS)
    torch.manual_seed(k)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.zero_()
        model.model.embed_tokens.weight[:, 0] = 1.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        model.lm_head.weight[k, 0] = C
    return model


def expected_log_prob(is_k: bool, temperature: float) -> float:
    scaled = LOGIT / temperature
    log_z = math.log(math.exp(scaled) + VOCAB - 1)
    return (scaled if is_k else 0.0) - log_z


def save(model, path: str) -> str:
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def run_cycle(engine_cls, tmp_path, rollout_overrides: dict) -> None:
    """generate → sleep → wake weights → push another model → wake KV → generate; checked against the closed
    form and HF's generate."""
    from verlx.config.roles import RolloutConfig
    from verlx.protocol import DataProto
    from verlx.rollout.base import RolloutContext

    first, second = constant_model(7), constant_model(11)
    path = save(first, str(tmp_path / "model"))
    first, second = first.cuda(), second.cuda()
    config = RolloutConfig(prompt_length=8, response_length=8, dtype="bfloat16", gpu_memory_utilization=0.3,
                           load_format="dummy", calculate_log_probs=True, **rollout_overrides)
    ctx = RolloutContext(config=config, model_path=path, hf_config=first.config, device=torch.device("cuda", 0),
                         pad_token_id=PAD, eos_token_ids=[EOS])
    input_ids = torch.tensor([[PAD, PAD, 5, 9], [3, 4, 5, 6]], device="cuda")
    mask = (input_ids != PAD).long()
    prompts = lambda meta: DataProto(  # noqa: E731
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": torch.clamp(mask.cumsum(-1) - 1, min=0)},
        meta_info=meta,
    )
    engine = engine_cls(ctx)
    try:
        engine.update_weights(first.named_parameters())
        greedy = engine.generate(prompts({"do_sample": False}))
        hf = first.generate(input_ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=PAD)
        assert greedy.batch["responses"].tolist() == [[7] * 8, [7] * 8] == hf[:, 4:].tolist()

        engine.sleep()
        engine.wake_up(["weights"])
        engine.update_weights(second.named_parameters())
        engine.wake_up(["kv_cache"])
        assert engine.generate(prompts({"do_sample": False})).batch["responses"].tolist() == [[11] * 8, [11] * 8]

        sampled = engine.generate(prompts({"temperature": 2.0, "n": 4, "seed": 3}))
        tokens = sampled.batch["responses"]
        # p(11) is 2.8% at T=2: four samples of one prompt are all alike only if they share their noise
        assert len({tuple(row) for row in tokens[:4].tolist()}) == 4, tokens[:4].tolist()
        expected = torch.where(tokens == 11, expected_log_prob(True, 2.0), expected_log_prob(False, 2.0))
        # bf16 logits: a few 1e-2 of absolute error at most
        torch.testing.assert_close(sampled.batch["rollout_log_probs"].cpu(), expected.float().cpu() * sampled.batch[
            "response_mask"].cpu(), atol=3e-2, rtol=0)
    finally:
        engine.shutdown()
