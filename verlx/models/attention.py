"""Varlen attention for packed sequences, registered with transformers as the `verlx_packed` implementation.

HF decoders (Qwen2, Qwen3, Llama, Mistral) call `ALL_ATTENTION_FUNCTIONS[config._attn_implementation]` with
q/k/v [1, heads, T, D] and forward the decoder's extra kwargs to it. We pass tensors only: transformers' varlen
names (`cu_seq_lens_q/k`) plus a host copy of the boundaries (`cu_seq_lens_host`, from which the kernels' host
lengths come without a device sync) and, for Ulysses, the SP group. No Python numbers that change per micro-batch
travel through the decoder layers, so torch.compile'd layers are not re-specialised per batch. Our mask
function returns no mask for packed input, so no [T, T] tensor is ever built; called with a 2-D padding mask
(plain padded batches, e.g. HF generation) it builds what SDPA would and the attention falls through to SDPA.

The attention function is opaque to torch.compile (`torch.compiler.disable`): compiled decoder layers break the
graph around it and run the chosen kernel with its own autograd (a custom op could not reuse the kernels' backward
without recomputing the forward), so the norms, rotary embedding and MLP fuse while attention stays as it is.

Kernels, first usable wins: flash_attn's varlen kernel, torch's `torch.nn.attention.varlen.varlen_attn` (CUDA,
fp16/bf16), then SDPA sequence by sequence (any device and dtype; the exact reference). A fast kernel is probed
once per (device, dtype, head layout, window) against the reference before use; one that raises or disagrees is
skipped with a warning, so a torch or flash_attn whose API changed degrades to the reference instead of failing.
"""

from __future__ import annotations

import inspect
import logging

import torch
import torch.nn.functional as F

from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)

PACKED_ATTENTION = "verlx_packed"
VARLEN_KERNELS: Registry = Registry("varlen attention kernel")
KERNEL_PREFERENCE = ("flash_attn", "torch_varlen", "sdpa_per_sequence")
_forced_kernel: str | None = None


def force_kernel(name: str | None) -> None:
    """Use only kernel `name` (None: the first usable in KERNEL_PREFERENCE); for benchmarks and tests."""
    global _forced_kernel
    if name is not None:
        VARLEN_KERNELS.get(name)
    _forced_kernel = name


def _window(sliding_window: int | None, max_seqlen: int) -> int | None:
    """The HF window (a query sees itself and the `w - 1` tokens before it), or None when it never binds."""
    return sliding_window if sliding_window is not None and sliding_window < max_seqlen else None


# ---------------------------------------------------------------------------------------------- kernels
@VARLEN_KERNELS.register("sdpa_per_sequence")
class SdpaPerSequence:
    """SDPA on each sequence's own [heads, L, D] block: exact, any device, no mask beyond one sequence's window."""

    probe = False

    def unusable_reason(self, q, window, dropout) -> str | None:
        return None

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, seq_lens, scale, window, dropout):
        gqa = q.shape[1] != k.shape[1]
        outs, start = [], 0
        for length in seq_lens:
            end = start + length
            qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
            mask = None
            if window is not None and length > window:
                i = torch.arange(length, device=q.device)
                mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, dropout_p=dropout,
                                                 is_causal=mask is None, scale=scale, enable_gqa=gqa)
            outs.append(out.transpose(0, 1))
            start = end
        return torch.cat(outs)


@VARLEN_KERNELS.register("flash_attn")
class FlashAttnVarlen:
    """flash_attn.flash_attn_varlen_func (flash-attn 2.x), when installed."""

    probe = True

    def __init__(self):
        try:
            from flash_attn import flash_attn_varlen_func
        except ImportError:
            self.fn, self.missing = None, "flash_attn is not installed"
            return
        self.fn, self.missing = flash_attn_varlen_func, None
        self.has_window = "window_size" in inspect.signature(flash_attn_varlen_func).parameters

    def unusable_reason(self, q, window, dropout) -> str | None:
        if self.fn is None:
            return self.missing
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            return f"needs CUDA fp16/bf16 tensors, got {q.device.type} {q.dtype}"
        if window is not None and not self.has_window:
            return "this flash_attn has no window_size (sliding-window attention)"
        return None

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, seq_lens, scale, window, dropout):
        kwargs = {"window_size": (window - 1, 0)} if window is not None else {}
        return self.fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p=dropout,
                       softmax_scale=scale, causal=True, **kwargs)


@VARLEN_KERNELS.register("torch_varlen")
class TorchVarlen:
    """torch.nn.attention.varlen.varlen_attn, adapted to the signature of the installed torch.

    torch 2.11: (q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux, scale, window_size); causal is
    window_size == (-1, 0) (a tuple), no GQA (KV heads are repeated here). torch 2.13 adds enable_gqa. A torch
    with `is_causal` instead of `window_size` is served without sliding windows.
    """

    probe = True

    def __init__(self, varlen_attn=None):
        if varlen_attn is None:
            try:
                from torch.nn.attention.varlen import varlen_attn
            except ImportError:
                self.fn, self.missing = None, f"torch {torch.__version__} has no torch.nn.attention.varlen"
                return
        params = inspect.signature(varlen_attn).parameters
        self.fn, self.missing = varlen_attn, None
        self.has_window, self.has_is_causal = "window_size" in params, "is_causal" in params
        self.has_gqa = "enable_gqa" in params
        if not (self.has_window or self.has_is_causal) or "scale" not in params:
            self.fn, self.missing = None, f"unrecognised varlen_attn signature {inspect.signature(varlen_attn)}"

    def unusable_reason(self, q, window, dropout) -> str | None:
        if self.fn is None:
            return self.missing
        if not q.is_cuda or q.dtype not in (torch.float16, torch.bfloat16):
            return f"needs CUDA fp16/bf16 tensors, got {q.device.type} {q.dtype}"
        if dropout:
            return "has no attention dropout"
        if window is not None and not self.has_window:
            return "this torch's varlen_attn has no window_size (sliding-window attention)"
        return None

    def __call__(self, q, k, v, cu_seqlens, max_seqlen, seq_lens, scale, window, dropout):
        kwargs = {}
        if self.has_window:
            kwargs["window_size"] = (-1, 0) if window is None else (window - 1, 0)
        else:
            kwargs["is_causal"] = True
        if q.shape[1] != k.shape[1]:
            if self.has_gqa:
                kwargs["enable_gqa"] = True
            else:
                repeats = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        return self.fn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, scale=scale, **kwargs)


# ---------------------------------------------------------------------------------------------- selection
_instances: dict[str, object] = {}
_probe_results: dict[tuple, str | None] = {}


def _kernel(name: str):
    if name not in _instances:
        _instances[name] = VARLEN_KERNELS.get(name)()
    return _instances[name]


def _probe(name: str, kernel, q, k, window) -> str | None:
    """Run `kernel` once on a small problem shaped like (q, k) and compare value and input gradients to SDPA."""
    key = (name, q.device, q.dtype, q.shape[1], k.shape[1], q.shape[2], window is not None)
    if key in _probe_results:
        return _probe_results[key]
    lengths = [5, 11] if window is None else [5, 11 + window]
    gen = torch.Generator(device="cpu").manual_seed(0)
    shapes = [(sum(lengths), t.shape[1], t.shape[2]) for t in (q, k, k)]
    tensors = [torch.randn(s, generator=gen).to(q.device, q.dtype).requires_grad_() for s in shapes]
    cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=q.device)
    scale = q.shape[2] ** -0.5
    try:
        with torch.enable_grad():
            out = kernel(*tensors, cu, max(lengths), lengths, scale, window, 0.0)
            grads = torch.autograd.grad(out.float().square().sum(), tensors)
            ref_in = [t.detach().float().requires_grad_() for t in tensors]
            ref = SdpaPerSequence()(*ref_in, cu, max(lengths), lengths, scale, window, 0.0)
            ref_grads = torch.autograd.grad(ref.square().sum(), ref_in)
        tol = 1e-4 if q.dtype == torch.float32 else 1e-1
        bad = [n for n, a, b in zip(("out", "dq", "dk", "dv"), (out, *grads), (ref, *ref_grads))
               if not torch.allclose(a.float(), b, atol=tol, rtol=tol)]
        reason = f"disagrees with SDPA on a probe problem ({', '.join(bad)})" if bad else None
    except Exception as e:  # noqa: BLE001 - any failure of a kernel or API here means: fall back, say why
        reason = f"raised {type(e).__name__}: {e}"
    if reason:
        logger.warning("varlen attention kernel %s skipped for %s %s: %s", name, q.device, q.dtype, reason)
    _probe_results[key] = reason
    return reason


def select_kernel(q, k, window, dropout):
    """The first usable kernel for these tensors (or the forced one; it must be usable)."""
    names = (_forced_kernel,) if _forced_kernel else KERNEL_PREFERENCE
    reasons = []
    for name in names:
        kernel = _kernel(name)
        reason = kernel.unusable_reason(q, window, dropout)
        if reason is None and kernel.probe:
            reason = _probe(name, kernel, q, k, window)
        if reason is None:
            return kernel
        reasons.append(f"{name}: {reason}")
    raise RuntimeError(f"no usable varlen attention kernel ({'; '.join(reasons)})")


# ---------------------------------------------------------------------------------------------- transformers glue
def packed_attention_kwargs(cu_seqlens: torch.Tensor, cu_seqlens_host: torch.Tensor, sp_group=None) -> dict:
    """The kwargs a decoder forwards to every attention call for a packed [1, T] input (tensors only)."""
    kwargs = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "cu_seq_lens_host": cu_seqlens_host}
    if sp_group is not None:
        kwargs["ulysses_group"] = sp_group
    return kwargs


def prepared_packed_mask(device) -> torch.Tensor:
    """The decoder's `attention_mask` for a packed call: a 4-D tensor, which transformers' mask creation takes as a
    prepared mask and returns untouched. Given None instead, it looks for packed sequences in position_ids and
    ends in `bool(tensor.all())`: a device-to-host sync every forward. packed_attention_forward never reads it
    (the boundaries travel as cu_seqlens)."""
    return torch.ones((1, 1, 1, 1), dtype=torch.bool, device=device)


@torch.compiler.disable
def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             sliding_window: int | None = None, **kwargs):
    """HF attention-function signature: q/k/v [1, heads, T_local, D] → ([1, T_local, heads, D], None)."""
    cu_seqlens = kwargs.get("cu_seq_lens_q")
    if cu_seqlens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      sliding_window=sliding_window, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    host = kwargs.get("cu_seq_lens_host")
    seq_lens = tuple((host if host is not None else cu_seqlens.cpu()).diff().tolist())
    max_seqlen = max(seq_lens)
    group = kwargs.get("ulysses_group")
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # [T_local, heads, D]
    if group is not None:
        from verlx.models.ulysses import heads_to_seq, kv_repeats, seq_to_heads

        repeats = kv_repeats(k.shape[1], torch.distributed.get_world_size(group))
        if repeats > 1:
            k, v = k.repeat_interleave(repeats, dim=1), v.repeat_interleave(repeats, dim=1)
        q, k, v = (seq_to_heads(t, group) for t in (q, k, v))
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    window = _window(sliding_window, max_seqlen)
    kernel = select_kernel(q, k, window, dropout)
    out = kernel(q, k, v, cu_seqlens, max_seqlen, seq_lens, scale, window, dropout)
    if group is not None:
        out = heads_to_seq(out, group)
    return out.unsqueeze(0), None


def packed_attention_mask(*args, attention_mask=None, **kwargs):
    """No mask for packed input (boundaries travel as cu_seqlens); SDPA's mask for a padded batch."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_packed_attention() -> str:
    """Make `PACKED_ATTENTION` a valid attn_implementation (idempotent); returns the name."""
    from transformers import AttentionInterface

    AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
    try:
        from transformers.masking_utils import AttentionMaskInterface
    except ImportError:  # older transformers: no mask interface, the model builds its own masks
        return PACKED_ATTENTION
    AttentionMaskInterface.register(PACKED_ATTENTION, packed_attention_mask)
    return PACKED_ATTENTION


def use_packed_attention(model) -> None:
    """Switch a loaded HF model to the packed attention; a clear error when the model cannot use it."""
    name = register_packed_attention()
    config = model.config
    if getattr(config, "_attn_implementation", None) != name:
        if hasattr(model, "set_attn_implementation"):
            model.set_attn_implementation(name)
        else:
            config._attn_implementation = name
    if getattr(config, "_attn_implementation", None) != name:
        raise ValueError(f"{type(model).__name__} does not take custom attention functions (transformers' "
                         "AttentionInterface), so it cannot run packed sequences; set use_remove_padding=False")
