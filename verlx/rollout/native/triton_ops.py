"""Fused Triton kernels for the decode step (imported only when the triton backend is selected).

* rope_cache: q/k norm (Qwen3) + RoPE of q and k, and the K/V write into the per-slot cache — one kernel
  instead of about eight, reading the fused qkv projection once; all heads of a slot in one program (up to
  2048 values), not one tiny program per head.
* decode_attention: flash-decoding over each slot's own length (pos + 1 keys, or the sliding window), the G
  query heads of a KV head computed as one tile so K/V are read once per KV head; split over the key range
  when the batch is too small to fill the GPU, with a combine kernel.
* swiglu: silu(gate) * up in one pass.
* rms_norm: one program per row (torch's fused layer-norm kernel takes ~3 us a launch at decode sizes, and a
  step has 2 per layer + 1); HF's order: float32 statistics, normalised value rounded, then times the weight.
Arithmetic is float32 inside the kernels with one rounding on store (HF rounds after every op in bf16), so
results agree with the torch backend to bf16 rounding, not bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_N = 64
MAX_SPLITS = 16
ROPE_TILE = 2048  # values per rope_cache program: all heads of a slot for Qwen2.5 0.5B/1.5B


@triton.jit
def _rope_cache_kernel(
    qkv_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, cos_ptr, sin_ptr, pos_ptr, norm_ptr,
    stride_qkv_b, stride_q_b, stride_c_slot, stride_c_head, stride_c_pos, stride_rope, eps,
    HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr, QK_NORM: tl.constexpr, HEADS: tl.constexpr,
):
    slot = tl.program_id(0)
    head = tl.program_id(1) * HEADS + tl.arange(0, HEADS)[:, None]  # q heads, then k heads, then v heads
    d = tl.arange(0, D)[None, :]
    rot = (d + D // 2) % D
    present = (head < HQ + 2 * HKV) & (d < D)
    is_qk = (head < HQ + HKV) & (d < D)
    pos = tl.load(pos_ptr + slot).to(tl.int32)
    row = qkv_ptr + slot * stride_qkv_b + head * D
    raw = tl.load(row + d, mask=present, other=0.0)
    x = raw.to(tl.float32)
    x_rot = tl.load(row + rot, mask=present, other=0.0).to(tl.float32)
    if QK_NORM:  # per head: one statistic over its D values (v heads get one too, unused)
        inv = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)[:, None]
        x = x * inv * tl.load(norm_ptr + head * D + d, mask=is_qk, other=0.0).to(tl.float32)
        x_rot = x_rot * inv * tl.load(norm_ptr + head * D + rot, mask=is_qk, other=0.0).to(tl.float32)
    cos = tl.load(cos_ptr + pos * stride_rope + d).to(tl.float32)
    sin = tl.load(sin_ptr + pos * stride_rope + d).to(tl.float32)
    y = x * cos + x_rot * sin
    tl.store(q_out_ptr + slot * stride_q_b + head * D + d, y.to(q_out_ptr.dtype.element_ty), mask=is_qk & (head < HQ))
    cache_row = slot.to(tl.int64) * stride_c_slot + pos * stride_c_pos + d  # int64: caches can pass 2^31 elements
    tl.store(k_cache_ptr + cache_row + (head - HQ) * stride_c_head, y.to(k_cache_ptr.dtype.element_ty),
             mask=is_qk & (head >= HQ))
    tl.store(v_cache_ptr + cache_row + (head - HQ - HKV) * stride_c_head, raw.to(v_cache_ptr.dtype.element_ty),
             mask=present & (head >= HQ + HKV))


@triton.jit
def _decode_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, out_ptr, part_acc_ptr, part_ml_ptr,
    stride_q_b, stride_c_slot, stride_c_head, stride_c_pos, scale, window,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, SPLITS: tl.constexpr,
):
    slot = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    pos = tl.load(pos_ptr + slot).to(tl.int32)
    end = pos + 1
    start = tl.where(window > 0, tl.maximum(end - window, 0), 0)
    blocks = tl.cdiv(end - start, BLOCK)
    per_split = tl.cdiv(blocks, SPLITS)
    lo = start + split * per_split * BLOCK
    hi = tl.minimum(lo + per_split * BLOCK, end)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    q_rows = q_ptr + slot * stride_q_b + (kv_head * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_rows, mask=(g < G)[:, None], other=0.0)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l_sum = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    base = slot.to(tl.int64) * stride_c_slot + kv_head * stride_c_head
    for n0 in range(lo, hi, BLOCK):
        n = n0 + tl.arange(0, BLOCK)
        valid = n < hi
        offsets = base + n[:, None] * stride_c_pos + d[None, :]
        k = tl.load(k_cache_ptr + offsets, mask=valid[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + tl.sum(p, axis=1)
        v = tl.load(v_cache_ptr + offsets, mask=valid[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    if SPLITS == 1:
        out = acc / l_sum[:, None]
        out_rows = out_ptr + slot * (G * D * tl.num_programs(1)) + (kv_head * G + g)[:, None] * D + d[None, :]
        tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])
    else:
        part = (slot * tl.num_programs(1) + kv_head) * SPLITS + split
        tl.store(part_acc_ptr + part * G_PAD * D + g[:, None] * D + d[None, :], acc)
        tl.store(part_ml_ptr + part * 2 * G_PAD + g, m)
        tl.store(part_ml_ptr + part * 2 * G_PAD + G_PAD + g, l_sum)


@triton.jit
def _combine_kernel(
    part_acc_ptr, part_ml_ptr, out_ptr,
    G: tl.constexpr, G_PAD: tl.constexpr, D: tl.constexpr, SPLITS: tl.constexpr,
):
    slot = tl.program_id(0)
    kv_head = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D)
    first = (slot * tl.num_programs(1) + kv_head) * SPLITS
    m_all = tl.full([G_PAD], float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        m_all = tl.maximum(m_all, tl.load(part_ml_ptr + (first + s) * 2 * G_PAD + g))
    l_all = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D], tl.float32)
    for s in tl.static_range(SPLITS):
        m = tl.load(part_ml_ptr + (first + s) * 2 * G_PAD + g)
        w = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_all))  # an empty split contributes nothing
        l_all += tl.load(part_ml_ptr + (first + s) * 2 * G_PAD + G_PAD + g) * w
        acc += tl.load(part_acc_ptr + (first + s) * G_PAD * D + g[:, None] * D + d[None, :]) * w[:, None]
    out = acc / l_all[:, None]
    out_rows = out_ptr + slot * (G * D * tl.num_programs(1)) + (kv_head * G + g)[:, None] * D + d[None, :]
    tl.store(out_rows, out.to(out_ptr.dtype.element_ty), mask=(g < G)[:, None])


@triton.jit
def _swiglu_kernel(gate_up_ptr, out_ptr, stride_in, stride_out, INTER, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = col < INTER
    gate = tl.load(gate_up_ptr + row * stride_in + col, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(gate_up_ptr + row * stride_in + INTER + col, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + col, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, stride_x, stride_out, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    normed = (x * tl.rsqrt(tl.sum(x * x, axis=0) / n + eps)).to(out_ptr.dtype.element_ty)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + row * stride_out + cols, normed * w, mask=mask)


class TritonDecodeOps:
    """The decode-layer pieces as three or four kernel launches, and RMSNorm as one."""

    reads_exact_lengths = True

    def __init__(self, model):
        self.model = model
        spec = model.spec
        if spec.head_dim & (spec.head_dim - 1) or spec.head_dim < 16:
            raise ValueError(f"triton decode kernels need a power-of-two head_dim >= 16, got {spec.head_dim}")
        self.g_pad = max(16, triton.next_power_of_2(spec.group_size))
        device = model.cos.device
        self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 8
        self.forced_splits: int | None = None

    def splits(self, batch: int) -> int:
        """Key-range splits per (slot, KV head): enough programs to fill the GPU twice over."""
        if self.forced_splits is not None:
            return self.forced_splits
        programs = batch * self.model.spec.num_kv_heads
        max_splits = max(1, min(MAX_SPLITS, self.model.cos.shape[0] // (4 * BLOCK_N)))
        wanted = min(max_splits, -(-2 * self.num_sms // programs))
        return 1 << (wanted.bit_length() - 1) if wanted > 1 else 1  # powers of two: few kernel variants

    def prepare(self, pos: torch.Tensor, kv_len: int, cache) -> dict:
        return dict(pos=pos, splits=self.splits(pos.shape[0]))

    def attention(self, i: int, lw: dict, qkv: torch.Tensor, step: dict, cache) -> torch.Tensor:
        spec, m = self.model.spec, self.model
        b = qkv.shape[0]
        hq, hkv, d, g = spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.group_size
        pos = step["pos"]
        k_cache, v_cache = cache.layer(i)
        q = torch.empty(b, hq, d, dtype=qkv.dtype, device=qkv.device)
        norm = lw.get("qk_norm", qkv)
        heads = min(triton.next_power_of_2(hq + 2 * hkv), max(1, ROPE_TILE // d))
        _rope_cache_kernel[(b, triton.cdiv(hq + 2 * hkv, heads))](
            qkv, q, k_cache, v_cache, m.cos, m.sin_signed, pos, norm,
            qkv.stride(0), q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), m.cos.stride(0),
            spec.rms_norm_eps, HQ=hq, HKV=hkv, D=d, QK_NORM=spec.features.qk_norm, HEADS=heads,
        )
        out = torch.empty(b, hq * d, dtype=qkv.dtype, device=qkv.device)
        splits = step["splits"]
        window = spec.sliding_windows[i] or 0
        args = (q, k_cache, v_cache, pos, out)
        strides = (q.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), d**-0.5, window)
        meta = dict(G=g, G_PAD=self.g_pad, D=d)
        if splits == 1:
            _decode_attention_kernel[(b, hkv, 1)](*args, out, out, *strides, **meta, BLOCK=BLOCK_N, SPLITS=1)
            return out
        part_acc = torch.empty(b * hkv * splits * self.g_pad * d, dtype=torch.float32, device=qkv.device)
        part_ml = torch.empty(b * hkv * splits * 2 * self.g_pad, dtype=torch.float32, device=qkv.device)
        _decode_attention_kernel[(b, hkv, splits)](
            *args, part_acc, part_ml, *strides, **meta, BLOCK=BLOCK_N, SPLITS=splits
        )
        _combine_kernel[(b, hkv)](part_acc, part_ml, out, **meta, SPLITS=splits)
        return out

    @staticmethod
    def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
        rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
        out = torch.empty(rows, inter, dtype=gate_up.dtype, device=gate_up.device)
        block = 1024
        _swiglu_kernel[(rows, triton.cdiv(inter, block))](gate_up, out, gate_up.stride(0), out.stride(0), inter,
                                                          BLOCK=block)
        return out

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows, n = x.shape
        out = torch.empty_like(x)
        _rms_norm_kernel[(rows,)](x, weight, out, x.stride(0), out.stride(0), n, eps, BLOCK=triton.next_power_of_2(n))
        return out


def self_test(model, cache) -> str | None:
    """One decode layer through both backends on random values in slots 0..3 of the (still empty) cache:
    None if outputs and cache writes agree to bf16 rounding, else what differed."""
    from verlx.rollout.native.decode_ops import TorchDecodeOps

    spec = model.spec
    device, dtype = model.cos.device, model.cos.dtype
    b = min(4, cache.plan.slots)
    length = min(cache.plan.max_len, 200)
    gen = torch.Generator(device=device).manual_seed(0)
    k_cache, v_cache = cache.layer(0)
    for c in (k_cache, v_cache):
        c[:b, :, :length].copy_(torch.randn(c[:b, :, :length].shape, generator=gen, device=device))
    pos = torch.tensor([length - 1, 0, length // 2, 7][:b], device=device)
    qkv = torch.randn(b, spec.qkv_rows, generator=gen, device=device).to(dtype)
    lw = model.weights.layer(0)
    torch_ops, triton_ops = TorchDecodeOps(model), TritonDecodeOps(model)
    expected = torch_ops.attention(0, lw, qkv, torch_ops.prepare(pos, length, cache), cache)
    index = cache.decode_index(pos)
    written = (k_cache[index].clone(), v_cache[index].clone())
    for splits in (1, 2):
        triton_ops.forced_splits = splits
        got = triton_ops.attention(0, lw, qkv, triton_ops.prepare(pos, length, cache), cache)
        for name, a, e in (("attention", got, expected), ("k write", k_cache[index], written[0]),
                           ("v write", v_cache[index], written[1])):
            err = (a.float() - e.float()).abs().max().item()
            if not err <= 0.03 * max(1.0, e.float().abs().max().item()):
                return f"{name} differs by {err:.3g} (splits={splits})"
    gate_up = torch.randn(b, 2 * spec.intermediate_size, generator=gen, device=device).to(dtype)
    err = (triton_ops.swiglu(gate_up).float() - torch_ops.swiglu(gate_up).float()).abs().max().item()
    if not err <= 0.03 * max(1.0, torch_ops.swiglu(gate_up).float().abs().max().item()):
        return f"swiglu differs by {err:.3g}"
    h = torch.randn(b, spec.hidden_size, generator=gen, device=device).to(dtype)
    expected = torch_ops.rms_norm(h, lw["in_norm"], spec.rms_norm_eps).float()
    err = (triton_ops.rms_norm(h, lw["in_norm"], spec.rms_norm_eps).float() - expected).abs().max().item()
    if not err <= 0.03 * max(1.0, expected.abs().max().item()):
        return f"rms_norm differs by {err:.3g}"
    return None
