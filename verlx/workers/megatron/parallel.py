"""The parallel layout of one megatron role: sizes, their checks, and each global rank's coordinates.

Megatron orders ranks tp-cp-dp-pp (tensor parallel fastest): rank = tp + TP·(cp + CP·(dp + DP·pp)).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    vpp: int | None = None
    ep: int = 1  # expert parallel (mixture-of-experts models): experts spread over data-parallel ranks
    etp: int | None = None  # expert tensor parallel; None = tp

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp

    @property
    def dp(self) -> int:
        return self.world_size // (self.tp * self.pp * self.cp)

    @property
    def model_parallel_size(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def chunks(self) -> int:
        """Model chunks per pipeline stage (virtual pipeline stages)."""
        return self.vpp or 1

    def coords(self, rank: int) -> dict[str, int]:
        tp_rank = rank % self.tp
        cp_rank = rank // self.tp % self.cp
        dp_rank = rank // (self.tp * self.cp) % self.dp
        pp_rank = rank // (self.tp * self.cp * self.dp)
        return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}


def check_layout(world_size: int, tp: int, pp: int, cp: int = 1, vpp: int | None = None, *,
                 num_heads: int | None = None, num_kv_heads: int | None = None, num_layers: int | None = None,
                 key: str = "megatron") -> list[str]:
    """Every problem with these sizes, each naming the key and the numbers; empty when the layout works."""
    problems: list[str] = []
    for name, value in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                        ("context_parallel_size", cp)):
        if value < 1:
            problems.append(f"{key}.{name}={value} must be >= 1")
    if problems:
        return problems
    model_parallel = tp * pp * cp
    if world_size % model_parallel:
        problems.append(
            f"{key}: tensor_model_parallel_size × pipeline_model_parallel_size × context_parallel_size = "
            f"{tp}×{pp}×{cp} = {model_parallel} does not divide the world size {world_size} "
            f"(trainer.nnodes × trainer.n_gpus_per_node); pick sizes whose product divides {world_size}"
        )
    if num_heads is not None and num_heads % tp:
        problems.append(f"{key}.tensor_model_parallel_size={tp} does not divide the model's "
                        f"num_attention_heads={num_heads}")
    if num_kv_heads is not None and num_kv_heads % tp:
        problems.append(f"{key}.tensor_model_parallel_size={tp} does not divide the model's "
                        f"num_key_value_heads={num_kv_heads} (each TP rank needs whole query groups)")
    if vpp is not None:
        if vpp < 1:
            problems.append(f"{key}.virtual_pipeline_model_parallel_size={vpp} must be >= 1 or null")
        elif vpp > 1 and pp < 2:
            problems.append(f"{key}.virtual_pipeline_model_parallel_size={vpp} needs "
                            f"pipeline_model_parallel_size >= 2 (got {pp})")
    if num_layers is not None:
        chunks = pp * (vpp or 1)
        if num_layers % chunks:
            problems.append(
                f"{key}: the model's num_hidden_layers={num_layers} do not split evenly into "
                f"pipeline_model_parallel_size × virtual_pipeline_model_parallel_size = {pp}×{vpp or 1} = {chunks} "
                "model chunks"
            )
    return problems


def require_layout(world_size: int, tp: int, pp: int, cp: int = 1, vpp: int | None = None, ep: int = 1,
                   etp: int | None = None, **model) -> ParallelLayout:
    problems = check_layout(world_size, tp, pp, cp, vpp, **model)
    if problems:
        raise ValueError("invalid megatron parallel layout:\n" + "\n".join(f"  - {p}" for p in problems))
    return ParallelLayout(world_size, tp, pp, cp, vpp if vpp and vpp > 1 else None, ep, etp)
