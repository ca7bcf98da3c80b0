"""The preallocated per-slot KV cache and how many slots fit.

Layout [layers, 2, slots, kv_heads, max_len, head_dim]: every slot owns a contiguous max_len stretch per
head. Decode attention is then one batched SDPA over `cache[:, :, :b, :, :L]` — a strided view, no gather,
no copy — which is the fastest thing pure torch offers; a paged cache would need a per-step gather (a full
extra copy of the KV) or a custom kernel. The price is that every slot reserves max_model_len tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verlx.rollout.native.architectures import ModelSpec


@dataclass(frozen=True)
class CachePlan:
    slots: int
    max_len: int  # positions per slot: max_model_len rounded up to a multiple of 16
    bytes_per_token: int

    @property
    def nbytes(self) -> int:
        return self.slots * self.max_len * self.bytes_per_token


def kv_bytes_per_token(spec: ModelSpec, dtype: torch.dtype) -> int:
    return spec.num_layers * 2 * spec.num_kv_heads * spec.head_dim * torch.empty((), dtype=dtype).element_size()


def workspace_bytes(spec: ModelSpec, dtype: torch.dtype, slots: int, prefill_tokens: int) -> int:
    """Generous estimate of activations: logits and sampling temporaries per slot (float32 copies, a sort with
    int64 indices for top-p), prefill activations per token."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_slot = spec.vocab_size * (elem + 4 * 8)
    per_token = elem * (6 * spec.hidden_size + 2 * spec.qkv_rows + 3 * spec.intermediate_size)
    return slots * per_slot + prefill_tokens * per_token


def plan_cache(
    spec: ModelSpec,
    dtype: torch.dtype,
    device: torch.device,
    *,
    max_len: int,
    max_num_seqs: int,
    kv_cache_tokens: int | None,
    gpu_memory_utilization: float,
    weight_bytes: int,
    prefill_tokens: int,
) -> CachePlan:
    """Slots = min(max_num_seqs, budget // max_len). The budget is `kv_cache_tokens` if given; on a GPU,
    otherwise, gpu_memory_utilization × total memory minus weights and activations (vLLM's meaning)."""
    per_token = kv_bytes_per_token(spec, dtype)
    # rows padded to a multiple of 16 keep every KV-length bucket aligned for the fused attention kernels
    padded = -(-max_len // 16) * 16
    if kv_cache_tokens is not None:
        budget_tokens, source = int(kv_cache_tokens), f"engine_kwargs.native.kv_cache_tokens={kv_cache_tokens}"
    elif device.type == "cuda":
        if not 0.0 < gpu_memory_utilization <= 1.0:
            raise ValueError(f"rollout.gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
        total = torch.cuda.get_device_properties(device).total_memory
        fixed = workspace_bytes(spec, dtype, 0, prefill_tokens)
        per_slot_extra = workspace_bytes(spec, dtype, 1, 0)
        usable = int(gpu_memory_utilization * total) - weight_bytes - fixed
        # each slot costs its KV plus its share of the sampling workspace
        budget_tokens = max(0, usable) // (per_token + per_slot_extra // padded)
        source = (
            f"gpu_memory_utilization={gpu_memory_utilization} of {total / 2**30:.1f} GiB minus "
            f"{weight_bytes / 2**30:.2f} GiB weights and {fixed / 2**30:.2f} GiB activations"
        )
    else:
        budget_tokens, source = max_num_seqs * padded, "no limit on CPU"
    slots = min(max_num_seqs, budget_tokens // padded)
    if slots < 1:
        raise ValueError(
            f"native engine KV cache too small: {source} leaves room for {budget_tokens} tokens "
            f"({budget_tokens * per_token / 2**20:.1f} MiB at {per_token} bytes/token), but one sequence of "
            f"max_model_len={max_len} needs {padded} tokens ({padded * per_token / 2**20:.1f} MiB). Raise "
            "rollout.gpu_memory_utilization or engine_kwargs.native.kv_cache_tokens, or lower "
            "rollout.max_model_len / prompt_length + response_length."
        )
    return CachePlan(slots=slots, max_len=padded, bytes_per_token=per_token)


class KVCache:
    """Per-slot keys and values of every layer, plus the index arithmetic to write into them."""

    def __init__(self, spec: ModelSpec, plan: CachePlan, dtype: torch.dtype, device: torch.device):
        self.spec, self.plan = spec, plan
        s, h, length, d = plan.slots, spec.num_kv_heads, plan.max_len, spec.head_dim
        # zeros, not empty: masked positions still enter SDPA, and stale NaN bit patterns would poison it
        self.data = torch.zeros(spec.num_layers, 2, s, h, length, d, dtype=dtype, device=device)
        self._slot_ids = torch.arange(s, device=device)[:, None]
        self._head_ids = torch.arange(h, device=device)[None, :]

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.data[i, 0], self.data[i, 1]

    def decode_index(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(slot, head, position) index of the token at pos[slot] for slots 0..b-1, broadcast to [b, kv_heads]."""
        return self._slot_ids[: pos.shape[0]], self._head_ids, pos[:, None]

    def write_decode(self, i: int, index: tuple, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [b, kv_heads, head_dim] (any strides) into their slots at their positions: one kernel each."""
        self.data[i, 0].index_put_(index, k)
        self.data[i, 1].index_put_(index, v)

    def write_prefill(self, i: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [len(slots), kv_heads, L, head_dim] into positions 0..L-1 of the given slots."""
        length = k.shape[2]
        self.data[i, 0, slots, :, :length] = k
        self.data[i, 1, slots, :, :length] = v

    def move_slots(self, src: torch.Tensor, dst: torch.Tensor, length: int) -> None:
        """Copy the first `length` positions of slots src into slots dst (compaction), layer by layer."""
        for i in range(self.spec.num_layers):
            block = self.data[i, :, :, :, :length]
            block.index_copy_(1, dst, block.index_select(1, src))
