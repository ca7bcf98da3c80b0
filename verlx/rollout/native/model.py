"""The compact decoder (Llama/Qwen2/Qwen3/Mistral): prefill into the cache, one-token decode, scoring.

Written as plain functions over the fused weights so the decode step is a fixed sequence of kernels a CUDA
graph can capture: no allocation that depends on data, no host sync, no Python branching on tensor values.
The op order mirrors transformers' (float32 RMSNorm statistics, RoPE as x*cos + rotate_half(x)*sin in the
model dtype) so float32 logits agree with HF to rounding. The middle of a decode layer (RoPE, cache write,
attention, SwiGLU) comes from a decode backend (decode_ops.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from verlx.rollout.native.architectures import ModelSpec
from verlx.rollout.native.decode_ops import DECODE_BACKENDS, TorchDecodeOps, rotate
from verlx.rollout.native.kv_cache import KVCache
from verlx.rollout.native.weights import WeightStore

rms_norm = TorchDecodeOps.rms_norm


def _linear_residual(h: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """h + x @ weight.T (+ bias) as one GEMM when there is no bias."""
    if bias is None:
        return torch.addmm(h, x, weight.t())
    return h + F.linear(x, weight, bias)


class NativeModel:
    """Forward passes over a WeightStore; the cache is passed in so it can sleep independently."""

    def __init__(
        self, spec: ModelSpec, weights: WeightStore, cos: torch.Tensor, sin: torch.Tensor, decode_backend: str = "torch"
    ):
        self.spec, self.weights = spec, weights
        half = cos.shape[-1] // 2
        self.cos, self.sin_signed = cos, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        self.key_positions = torch.arange(cos.shape[0], device=cos.device)
        self.windows = sorted({w for w in spec.sliding_windows if w is not None})
        self.decode_ops = DECODE_BACKENDS.get(decode_backend)(self)

    # ------------------------------------------------------------------ shared pieces
    def _project_qkv(self, x: torch.Tensor, lw: dict, cos: torch.Tensor, sin: torch.Tensor):
        """x [T, hidden] -> q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, D] with q/k norm and RoPE applied.

        q and k are normalised and rotated together: they sit next to each other in the fused projection."""
        s = self.spec
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        qkv = F.linear(x, lw["qkv_w"], lw.get("qkv_b")).view(-1, hq + 2 * hkv, d)
        qk = qkv[:, : hq + hkv]
        if s.features.qk_norm:
            qk = rms_norm(qk, None, s.rms_norm_eps) * lw["qk_norm"]
        qk = rotate(qk, cos, sin)
        return qk[:, :hq], qk[:, hq:], qkv[:, hq + hkv :]

    def _finish_layer(self, h: torch.Tensor, attn: torch.Tensor, lw: dict, ops) -> torch.Tensor:
        """Output projection, residual, post-norm, SwiGLU MLP, residual; residual adds ride in the GEMM epilogue
        (so a norm kernel that also added the residual would not save a launch). `ops`: a decode backend."""
        h = _linear_residual(h, attn, lw["o_w"], lw.get("o_b"))
        normed = ops.rms_norm(h, lw["post_norm"], self.spec.rms_norm_eps)
        gate_up = F.linear(normed, lw["gate_up_w"], lw.get("gate_up_b"))
        return _linear_residual(h, ops.swiglu(gate_up), lw["down_w"], lw.get("down_b"))

    def logits(self, h: torch.Tensor, norm=rms_norm) -> torch.Tensor:
        """Model-dtype logits [b, V]: one GEMM over the lm_head weights, no float32 copy."""
        p = self.weights.params
        return F.linear(norm(h, p["norm"], self.spec.rms_norm_eps), p["lm_head"])

    # ------------------------------------------------------------------ prefill / scoring
    def _prompt_masks(self, length: int) -> dict[int | None, torch.Tensor | None]:
        """Per window: None (plain causal) or an explicit [L, L] causal+window mask."""
        masks: dict[int | None, torch.Tensor | None] = {None: None}
        q = self.key_positions[:length, None]
        kpos = self.key_positions[None, :length]
        for w in self.windows:
            masks[w] = None if length <= w else (kpos <= q) & (q - kpos < w)
        return masks

    def forward_prompt(
        self,
        tokens: torch.Tensor,
        cache: KVCache | None = None,
        slots: torch.Tensor | None = None,
        owner: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Right-padded prompts [b, L] -> final hidden states [b, L, hidden].

        With a cache, each prompt's keys/values go to positions 0..L-1 of the slots that sample from it:
        slots[i] receives prompt owner[i] (n samples of one prompt share one prefill).
        """
        s = self.spec
        b, length = tokens.shape
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        h = F.embedding(tokens.reshape(-1), self.weights.params["embed"])
        cos = self.cos[:length].repeat(b, 1)[:, None, :]
        sin = self.sin_signed[:length].repeat(b, 1)[:, None, :]
        masks = self._prompt_masks(length)
        for i in range(s.num_layers):
            lw = self.weights.layer(i)
            q, k, v = self._project_qkv(rms_norm(h, lw["in_norm"], s.rms_norm_eps), lw, cos, sin)
            q = q.view(b, length, hq, d).transpose(1, 2)
            k = k.view(b, length, hkv, d).transpose(1, 2)
            v = v.reshape(b, length, hkv, d).transpose(1, 2)
            if cache is not None:
                cache.write_prefill(i, slots, k.index_select(0, owner), v.index_select(0, owner))
            mask = masks[s.sliding_windows[i]]
            attn = F.scaled_dot_product_attention(
                q,
                k.repeat_interleave(s.group_size, dim=1),
                v.repeat_interleave(s.group_size, dim=1),
                attn_mask=mask,
                is_causal=mask is None,
            )
            attn = attn.transpose(1, 2).reshape(b * length, hq * d)
            h = self._finish_layer(h, attn, lw, TorchDecodeOps)
        return h.view(b, length, -1)

    def forward_extend(self, tokens: torch.Tensor, lengths: torch.Tensor, starts: torch.Tensor, cache: KVCache,
                       slots: torch.Tensor) -> torch.Tensor:
        """Continue sequences already in the cache (a later turn of a conversation): row i's first lengths[i]
        tokens of tokens [b, m] (right-padded) go to positions starts[i].. of slots[i], whose positions
        0..starts[i]-1 hold its earlier keys and values. Writes their K/V; returns each row's last hidden state
        [b, hidden]. One batched pass: every row attends causally over its own slot's prefix and new tokens."""
        s = self.spec
        b, m = tokens.shape
        dev = tokens.device
        cols = torch.arange(m, device=dev)
        qpos = (starts[:, None] + cols[None, :]).clamp(max=self.cos.shape[0] - 1)  # [b, m]; padding clamped
        valid = cols[None, :] < lengths[:, None]
        total = int((starts + lengths).max())
        kpos = self.key_positions[:total]
        mask = (kpos[None, None, :] <= qpos[:, :, None])[:, None]  # [b, 1, m, total]
        write_slot, write_pos = slots[:, None].expand(b, m)[valid], qpos[valid]
        h = F.embedding(tokens.reshape(-1), self.weights.params["embed"])
        cos = self.cos[qpos.reshape(-1)][:, None, :]
        sin = self.sin_signed[qpos.reshape(-1)][:, None, :]
        for i in range(s.num_layers):
            lw = self.weights.layer(i)
            q, k, v = self._project_qkv(rms_norm(h, lw["in_norm"], s.rms_norm_eps), lw, cos, sin)
            keys, values = cache.layer(i)
            keys[write_slot, :, write_pos] = k.view(b, m, -1, s.head_dim)[valid]
            values[write_slot, :, write_pos] = v.reshape(b, m, -1, s.head_dim)[valid]
            window = s.sliding_windows[i]
            layer_mask = mask if window is None else mask & (qpos[:, None, :, None] - kpos < window)
            attn = F.scaled_dot_product_attention(
                q.view(b, m, -1, s.head_dim).transpose(1, 2),
                keys.index_select(0, slots)[:, :, :total].repeat_interleave(s.group_size, dim=1),
                values.index_select(0, slots)[:, :, :total].repeat_interleave(s.group_size, dim=1),
                attn_mask=layer_mask,
            )
            h = self._finish_layer(h, attn.transpose(1, 2).reshape(b * m, -1), lw, TorchDecodeOps)
        return h.view(b, m, -1)[torch.arange(b, device=dev), lengths - 1]

    def score(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits of every position of unpadded sequences [b, L] -> [b, L, vocab] (tests and debugging)."""
        return self.logits(self.forward_prompt(tokens))

    # ------------------------------------------------------------------ decode
    def decode(self, tokens: torch.Tensor, pos: torch.Tensor, cache: KVCache, kv_len: int) -> torch.Tensor:
        """One token per slot 0..b-1 at positions pos -> logits [b, vocab]; writes the tokens' K/V.

        The decode backend (decode_ops) does q/k norm, RoPE, the cache write and attention; kv_len bounds the
        keys the torch backend attends over (the triton backend reads each slot's own length).
        """
        s = self.spec
        ops = self.decode_ops
        h = F.embedding(tokens, self.weights.params["embed"])
        step = ops.prepare(pos, kv_len, cache)
        for i in range(s.num_layers):
            lw = self.weights.layer(i)
            qkv = F.linear(ops.rms_norm(h, lw["in_norm"], s.rms_norm_eps), lw["qkv_w"], lw.get("qkv_b"))
            h = self._finish_layer(h, ops.attention(i, lw, qkv, step, cache), lw, ops)
        return self.logits(h, ops.rms_norm)
