"""Remove-padding: a padded micro-batch's real tokens packed into one row, and the way back.

The rollout layout is a left-padded prompt and a right-padded response, [B, P + R]. Packing keeps only the tokens
whose attention_mask is 1, concatenated into [1, T] (T = Σ real lengths, rounded up to a multiple of
`pad_multiple` for sequence parallelism), with each sequence's own position ids ([1, C, T] for the C position axes
of a vision-language batch's [B, C, P + R]); attention then needs the
sequence boundaries (`cu_seqlens`) instead of a mask. Log-probs are needed at response positions only: the
hidden state of packed token j predicts token j + 1, so `predictor_index` lists the j whose next token is a
real response token, and `scatter_responses` puts per-response-token values back into [B, R].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # [1, T] real tokens of every sequence, then `T - num_real_tokens` pad tokens
    position_ids: torch.Tensor  # [1, T] (or [1, C, T]) each sequence's own positions (the pad tail counts from 0)
    cu_seqlens: torch.Tensor  # int32 [S + 1] boundaries; the pad tail, if any, is its own last segment
    cu_seqlens_host: torch.Tensor  # the same boundaries on the CPU (kernels read host lengths from it, no sync)
    seq_lens: tuple[int, ...]  # host copy of the S segment lengths (for kernels that need them on the host)
    max_seqlen: int
    num_real_tokens: int
    token_index: torch.Tensor  # [num_real_tokens] position of each packed token in the flattened [B * (P + R)]
    predictor_index: torch.Tensor  # [N] packed positions whose hidden state predicts a real response token
    response_targets: torch.Tensor  # [N] those response tokens
    response_index: torch.Tensor  # [N] their positions in the flattened [B * R] response grid
    response_shape: tuple[int, int]  # (B, R)


class HostCopy:
    """A host tensor handed through a module call as it is. FSDP2's root pre-forward moves every tensor argument
    (also inside lists, dicts and dataclasses) to the device; an attribute of a plain object stays where it is."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def cu_seqlens_from_lengths(lengths: list[int], device=None) -> torch.Tensor:
    """[0, l0, l0 + l1, ...] as int32 (the dtype varlen kernels take)."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0)
    return out.to(device) if device is not None else out


def pack_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    response_length: int,
    pad_multiple: int = 1,
    pad_token_id: int = 0,
    host_mask: torch.Tensor | None = None,
) -> PackedBatch:
    """Pack the real tokens of [B, P + R] inputs into one row.

    All index arithmetic runs on a host copy of the mask: `host_mask` when the caller has one (the worker's batch
    is on the host before it moves to the device), else a copy of `attention_mask` (a device sync for device
    inputs); the indices travel to the device with non-blocking copies.
    """
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"pack_batch expects input_ids and attention_mask of one shape [batch, seq]; got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    batch, seq = input_ids.shape
    if position_ids.dim() not in (2, 3) or (position_ids.shape[0], position_ids.shape[-1]) != (batch, seq):
        raise ValueError(f"pack_batch takes position_ids of shape [batch, seq] {tuple(input_ids.shape)} or [batch, "
                         f"axes, seq] (multi-axis rotary positions); got {tuple(position_ids.shape)}")
    if not 0 < response_length < seq:
        raise ValueError(f"response_length={response_length} must be in (0, {seq}) for inputs of length {seq}")
    if host_mask is not None and (host_mask.shape != attention_mask.shape or host_mask.device.type != "cpu"):
        raise ValueError(f"host_mask must be a host copy of attention_mask {tuple(attention_mask.shape)}; got "
                         f"{tuple(host_mask.shape)} on {host_mask.device}")
    mask = (host_mask if host_mask is not None else attention_mask).bool().cpu()
    response_mask = mask[:, seq - response_length:]
    lengths, response_lens = torch.stack([mask.sum(-1), response_mask.sum(-1)]).tolist()
    short = [i for i, (n, r) in enumerate(zip(lengths, response_lens)) if n - r < 1]
    if short:
        raise ValueError(f"rows {short[:8]} have no prompt token before the response: the first response token "
                         "has nothing to be predicted from")
    real = sum(lengths)
    total = -(-max(real, 1) // pad_multiple) * pad_multiple
    tail = total - real

    flat_mask = mask.reshape(-1)
    token_index = flat_mask.nonzero().squeeze(1)
    # packed position of every padded position (meaningful where the mask is 1)
    packed_of = (flat_mask.cumsum(0) - 1).reshape(batch, seq)
    response_index = response_mask.reshape(-1).nonzero().squeeze(1)
    target_index = packed_of[:, seq - response_length:].reshape(-1)[response_index]
    seq_lens = tuple(lengths) + ((tail,) if tail else ())
    cu_host = cu_seqlens_from_lengths(list(seq_lens))

    device = input_ids.device
    token_index, response_index, target_index = (t.to(device, non_blocking=True)
                                                 for t in (token_index, response_index, target_index))
    packed_ids = torch.full((total,), pad_token_id, dtype=input_ids.dtype, device=device)
    packed_ids[:real] = input_ids.reshape(-1)[token_index]
    flat_pos = position_ids.movedim(0, -2).flatten(-2)  # [B * (P + R)], or [C, B * (P + R)]
    tail_pos = torch.arange(total, device=device, dtype=position_ids.dtype) - real
    packed_pos = tail_pos.expand(*flat_pos.shape[:-1], total).clone()
    packed_pos[..., :real] = flat_pos[..., token_index]
    return PackedBatch(
        input_ids=packed_ids.unsqueeze(0),
        position_ids=packed_pos.unsqueeze(0),
        cu_seqlens=cu_host.to(device, non_blocking=True),
        cu_seqlens_host=cu_host,
        seq_lens=seq_lens,
        max_seqlen=max(seq_lens),
        num_real_tokens=real,
        token_index=token_index,
        predictor_index=target_index - 1,
        response_targets=input_ids[:, seq - response_length:].reshape(-1)[response_index],
        response_index=response_index,
        response_shape=(batch, response_length),
    )


def pack_tokens(values: torch.Tensor, packed: PackedBatch, fill=0) -> torch.Tensor:
    """[B, P + R] per-token values → [1, T] in the packed row's order (the pad tail holds `fill`)."""
    out = values.new_full((packed.input_ids.shape[1],), fill)
    out[: packed.num_real_tokens] = values.reshape(-1)[packed.token_index]
    return out.unsqueeze(0)


def scatter_responses(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """[N, ...] values of the real response tokens → [B, R, ...], zeros at padding (differentiable)."""
    batch, response = packed.response_shape
    out = values.new_zeros((batch * response, *values.shape[1:])).index_put((packed.response_index,), values)
    return out.reshape(batch, response, *values.shape[1:])


def unpack_tokens(values: torch.Tensor, packed: PackedBatch, seq_len: int) -> torch.Tensor:
    """[T, ...] values of packed tokens (pad tail ignored) → [B, seq_len, ...], zeros at padding."""
    batch = packed.response_shape[0]
    out = values.new_zeros((batch * seq_len, *values.shape[1:]))
    out = out.index_put((packed.token_index,), values[: packed.num_real_tokens])
    return out.reshape(batch, seq_len, *values.shape[1:])


class ResponseRows:
    """The hidden states that predict response tokens (`hidden`, `targets`) and the way per-row results return
    to the padded [B, R, ...] layout (`assemble`); `select` picks the matching rows of a [B, R, ...] tensor.

    Padded: rows are the [B, R] grid itself. Packed: only real response tokens, [N]. Packed with Ulysses: only
    the response tokens whose predicting hidden state lives in this rank's slice of the sequence; `assemble`
    gathers every rank's results, so all SP ranks return the same [B, R, ...].
    """

    def __init__(self, hidden, targets, assemble, select):
        self.hidden, self.targets = hidden, targets
        self.assemble, self.select = assemble, select

    @classmethod
    def padded(cls, hidden: torch.Tensor, targets: torch.Tensor) -> ResponseRows:
        return cls(hidden, targets, lambda values: values, lambda rows: rows)

    @classmethod
    def packed(cls, hidden: torch.Tensor, batch: PackedBatch, sp_group=None) -> ResponseRows:
        """`hidden` is [T_local, H]: the whole packed row, or this SP rank's slice of it."""
        if sp_group is None:
            return cls(hidden[batch.predictor_index], batch.response_targets,
                       lambda values: scatter_responses(values, batch),
                       lambda rows: rows.flatten(0, 1)[batch.response_index])
        from verlx.models.ulysses import gather_sequence

        local = hidden.shape[0]
        start = torch.distributed.get_rank(sp_group) * local
        offset = batch.predictor_index - start
        mine = ((offset >= 0) & (offset < local)).nonzero().squeeze(1)  # response rows this rank predicts
        local_offset = offset[mine]

        def assemble(values: torch.Tensor) -> torch.Tensor:
            dense = values.new_zeros((local, *values.shape[1:])).index_put((local_offset,), values)
            return scatter_responses(gather_sequence(dense, sp_group)[batch.predictor_index], batch)

        return cls(hidden[local_offset], batch.response_targets[mine], assemble,
                   lambda rows: rows.flatten(0, 1)[batch.response_index[mine]])
