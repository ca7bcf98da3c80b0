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
    # uneven pipeline split (override_transformer_config.num_layers_in_first/last_pipeline_stage); None: even
    first_stage_layers: int | None = None
    last_stage_layers: int | None = None

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

    def stage_layers(self, num_layers: int) -> list[int]:
        """Decoder layers on each pipeline stage, first to last: megatron's rule (get_num_layers_to_build) — the
        first and last stages hold what the overrides say, the others share the rest evenly."""
        return stage_layer_counts(num_layers, self.pp, self.first_stage_layers, self.last_stage_layers)

    def coords(self, rank: int) -> dict[str, int]:
        tp_rank = rank % self.tp
        cp_rank = rank // self.tp % self.cp
        dp_rank = rank // (self.tp * self.cp) % self.dp
        pp_rank = rank // (self.tp * self.cp * self.dp)
        return {"tp": tp_rank, "cp": cp_rank, "dp": dp_rank, "pp": pp_rank}


def stage_layer_counts(num_layers: int, pp: int, first: int | None = None, last: int | None = None) -> list[int]:
    """Layers per pipeline stage; raises ValueError when the stages the overrides leave cannot share the rest
    evenly (the caller names the keys)."""
    fixed = {i: n for i, n in ((0, first), (pp - 1, last)) if n is not None}
    free = [i for i in range(pp) if i not in fixed]
    rest = num_layers - sum(fixed.values())
    if rest < 0 or (free and rest % len(free)) or (not free and rest):
        raise ValueError(f"{num_layers} layers leave {rest} for the {len(free)} other pipeline stage(s)")
    return [fixed.get(i, rest // len(free) if free else 0) for i in range(pp)]


def _uneven_problems(pp: int, vpp: int | None, num_layers: int | None, first: int | None, last: int | None,
                     key: str) -> list[str]:
    where = f"{key}.override_transformer_config"
    named = ", ".join(f"{where}.num_layers_in_{side}_pipeline_stage={n}"
                      for side, n in (("first", first), ("last", last)) if n is not None)
    if pp < 2:
        return [f"{named} needs pipeline_model_parallel_size >= 2 (got {pp})"]
    if vpp is not None and vpp > 1:
        return [f"{named} with virtual_pipeline_model_parallel_size={vpp}: verlx splits layers unevenly only "
                "without virtual pipeline stages; remove one of them"]
    if any(n < 1 for n in (first, last) if n is not None):
        return [f"{named}: every pipeline stage needs at least one layer"]
    if num_layers is None:
        return []
    try:
        counts = stage_layer_counts(num_layers, pp, first, last)
    except ValueError as e:
        return [f"{named}: the model's num_hidden_layers={num_layers} do not fit: {e}; megatron shares them evenly"]
    if min(counts) < 1:
        return [f"{named}: the model's num_hidden_layers={num_layers} leave a pipeline stage without layers"]
    return []


def check_layout(world_size: int, tp: int, pp: int, cp: int = 1, vpp: int | None = None, *,
                 num_heads: int | None = None, num_kv_heads: int | None = None, num_layers: int | None = None,
                 first_stage_layers: int | None = None, last_stage_layers: int | None = None,
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
    if first_stage_layers is not None or last_stage_layers is not None:
        problems += _uneven_problems(pp, vpp, num_layers, first_stage_layers, last_stage_layers, key)
    elif num_layers is not None:
        chunks = pp * (vpp or 1)
        if num_layers % chunks:
            problems.append(
                f"{key}: the model's num_hidden_layers={num_layers} do not split evenly into "
                f"pipeline_model_parallel_size × virtual_pipeline_model_parallel_size = {pp}×{vpp or 1} = {chunks} "
                "model chunks"
            )
    return problems


def require_layout(world_size: int, tp: int, pp: int, cp: int = 1, vpp: int | None = None, ep: int = 1,
                   etp: int | None = None, first_stage_layers: int | None = None, last_stage_layers: int | None = None,
                   **model) -> ParallelLayout:
    problems = check_layout(world_size, tp, pp, cp, vpp, first_stage_layers=first_stage_layers,
                            last_stage_layers=last_stage_layers, **model)
    if problems:
        raise ValueError("invalid megatron parallel layout:\n" + "\n".join(f"  - {p}" for p in problems))
    return ParallelLayout(world_size, tp, pp, cp, vpp if vpp and vpp > 1 else None, ep, etp, first_stage_layers,
                          last_stage_layers)
