"""Training settings left to verlx (null in the config), decided per GPU from a memory estimate.

- `use_dynamic_bsz` / `log_prob_use_dynamic_bsz` null: token-budget micro-batches unless a micro-batch size is set
  (utils.batch_sizes.dynamic_batches).
- `ppo_max_token_len_per_gpu` / `log_prob_max_token_len_per_gpu` / the critic's budgets null: the largest token
  budget whose estimated peak fits in SAFETY × the GPU's memory, less what other processes and the sleeping rollout
  engine hold and what every model of this GPU keeps resident in that phase (offload settings respected), capped at
  MAX_UPDATE_TOKENS (training) or MAX_FORWARD_TOKENS (log-probs, values) and rounded down to a multiple of ROUND_TO.
  Budgets count the tokens one GPU holds, in veRL's unit: under Ulysses a micro-batch holds budget × the Ulysses size
  tokens, each GPU of the group a slice of about budget tokens (utils.batch_sizes.sequence_split_size), so the
  estimate is per GPU and the longest sequence must fit budget × that size.
- `enable_gradient_checkpointing` null: off when a micro-batch of the target size (the budget the user set, the
  fixed micro-batch × the longest sequence, or EFFICIENT_MICRO_BATCH_TOKENS) fits without it; on otherwise.

The arithmetic is verlx.utils.memory_estimate. Workers decide when they start (the rollout engine is built and
asleep by then, so its share is measured), agree over the ranks (the smallest budget, checkpointing if any rank
needs it), log every choice once with its numbers and train with a copy of the config that has them filled in. An
explicit value always wins. On a CPU (or with megatron, whose memory the estimate does not model) the budgets are
CPU_TOKEN_BUDGET and checkpointing is off on CPU, on with megatron. `memory_problems` runs the same estimate in the
driver before Ray starts when a GPU is visible there (through NVML, without creating a CUDA context): a run that
cannot fit even with checkpointing and offload, or whose derived budget cannot hold the longest sequence, is a
config error before any GPU time.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import torch

from verlx.utils.batch_sizes import micro_batch_token_limit
from verlx.utils.errors import InputError
from verlx.utils.memory_estimate import (
    GIB,
    MIB,
    ModelShape,
    ModelState,
    forward_activation_bytes,
    fsdp_working_bytes,
    logits_chunk_bytes,
    training_activation_bytes,
)

logger = logging.getLogger(__name__)

SAFETY = 0.9  # of the GPU's memory the estimate may plan for: fragmentation, workspaces and kernels get the rest
EFFICIENT_MICRO_BATCH_TOKENS = 16384  # beyond this a GPU's share of a micro-batch is barely faster per token on an H100
# beyond ~10-16k tokens a micro-batch's update is no faster per token on an H100 (docs/benchmarks.md: 1.5B at 13,824
# tokens 38.6% MFU, at 9,216 39.3%); the caps keep the rest of the memory in reserve for errors of the estimate
MAX_UPDATE_TOKENS = 32768
MAX_FORWARD_TOKENS = 65536
CPU_TOKEN_BUDGET = 16384
ROUND_TO = 256
_baselines: dict[str, int] = {}


class MemoryPlanError(InputError, RuntimeError):
    """The estimate says the run cannot fit on this GPU; the message has the numbers and what to change."""


@dataclass(frozen=True)
class GpuMemory:
    """One GPU as the plan sees it: its size, what others held before this process built anything (CUDA contexts,
    other processes) and what the sleeping rollout engine keeps."""

    total: int
    held_by_others: int = 0
    asleep_engine: int = 0

    @property
    def usable(self) -> int:
        return int(SAFETY * self.total) - self.held_by_others - self.asleep_engine

    def describe(self) -> str:
        held = self.held_by_others + self.asleep_engine
        return f"usable {self.usable / GIB:.1f} GiB = {SAFETY} × {self.total / GIB:.1f} GiB − {held / GIB:.1f} GiB " \
               "held by other processes and the sleeping engine"


def process_baseline(device: torch.device) -> int | None:
    """Bytes of `device` in use before this process built any model (read once per process: colocated workers share
    it, and the models they build are counted by the plan itself); None off CUDA."""
    if device.type != "cuda":
        return None
    if str(device) not in _baselines:
        free, total = torch.cuda.mem_get_info(device)
        _baselines[str(device)] = total - free - torch.cuda.memory_reserved(device)
    return _baselines[str(device)]


def gpu_memory(device: torch.device, asleep_engine: int = 0) -> GpuMemory | None:
    baseline = process_baseline(device)
    if baseline is None:
        return None
    total = torch.cuda.get_device_properties(device).total_memory
    return GpuMemory(total, baseline, asleep_engine)


# ---------------------------------------------------------------------------------------------- the GPU's tenants
@dataclass(frozen=True)
class Tenant:
    """A model's state on this GPU and where its offload settings keep it between phases."""

    state: ModelState
    param_offload: bool = False
    optimizer_offload: bool = False
    on_host: bool = False  # fsdp_config.offload_policy: parameters, gradients and Adam live on the CPU throughout

    def resident(self, active: bool, updating: bool) -> int:
        """Bytes on the GPU during a phase; `active`: the phase computes with this model (`updating`: trains it)."""
        s = self.state
        if self.on_host:
            return 0
        if active and updating:
            return s.training_total
        optimizer = 0 if self.optimizer_offload else s.optimizer
        if active:
            return s.weights + optimizer
        return (0 if self.param_offload else s.weights) + optimizer


def resident_bytes(tenants: dict[str, Tenant], active: str, updating: bool) -> int:
    return sum(t.resident(name == active, updating) for name, t in tenants.items())


@dataclass(frozen=True)
class Workload:
    """One model's micro-batches on this GPU: its shape, whether its layers are compiled, its log-prob chunk (0:
    a value head, no vocabulary), the Ulysses size that splits each micro-batch, and the longest sequence. Token
    counts are per GPU (a micro-batch holds `sp` times as many), the unit of the budgets."""

    name: str
    shape: ModelShape
    compiled: bool
    chunk: int
    sp: int
    longest: int

    def activation_bytes(self, checkpointing: bool) -> int:
        return training_activation_bytes(self.shape, checkpointing, self.compiled)

    def update_peak(self, static: int, tokens: int, checkpointing: bool) -> int:
        """Estimated peak of an update whose micro-batches put `tokens` tokens on this GPU, `static` bytes being
        resident."""
        logits = logits_chunk_bytes(self.shape, min(self.chunk, tokens), self.compiled, training=True)
        return static + fsdp_working_bytes(self.shape, training=True) + logits + tokens * self.activation_bytes(
            checkpointing)

    def longest_share(self) -> int:
        """Tokens of one longest sequence on each GPU of its Ulysses group."""
        return -(-self.longest // self.sp)

    def update_budget(self, static: int, memory: GpuMemory, checkpointing: bool) -> int:
        room = memory.usable - static - fsdp_working_bytes(self.shape, training=True)
        room -= logits_chunk_bytes(self.shape, self.chunk, self.compiled, training=True)
        return _rounded(room // self.activation_bytes(checkpointing), MAX_UPDATE_TOKENS)

    def forward_budget(self, static: int, memory: GpuMemory) -> int:
        room = memory.usable - static - fsdp_working_bytes(self.shape, training=False)
        room -= logits_chunk_bytes(self.shape, self.chunk, self.compiled, training=False)
        return _rounded(room // forward_activation_bytes(self.shape, self.compiled), MAX_FORWARD_TOKENS)


def _rounded(tokens: int, cap: int) -> int:
    return max(min(tokens, cap) // ROUND_TO * ROUND_TO, 0)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


# ---------------------------------------------------------------------------------------------- decisions
@dataclass
class RoleChoices:
    """What the config leaves open for one trainable model (None: set by the user or not needed) and the target
    micro-batch (tokens) that checkpointing is decided for."""

    key: str  # the role's config path, named in messages
    checkpointing: bool | None
    update_budget_key: str | None
    forward_budget_keys: list[str]
    target_tokens: int  # per GPU, like the budgets


@dataclass
class Decision:
    checkpointing: bool
    update_budget: int | None = None
    forward_budget: int | None = None
    notes: list[str] = dataclasses.field(default_factory=list)


def check_fits_at_all(work: Workload, own: Tenant, memory: GpuMemory, key: str) -> None:
    """Raise when one longest sequence cannot be trained even with checkpointing and every other model offloaded."""
    static = own.resident(active=True, updating=True)
    share = work.longest_share()
    peak = work.update_peak(static, share, checkpointing=True)
    if peak <= memory.usable:
        return
    logits = logits_chunk_bytes(work.shape, min(work.chunk, share), work.compiled, training=True)
    split = f", {share} of them on each of the {work.sp} GPUs of its Ulysses group" if work.sp > 1 else ""
    raise MemoryPlanError(
        f"{key}: the {work.name} update cannot fit on this GPU even with gradient checkpointing and param/optimizer "
        f"offload: it needs an estimated {_gib(peak)} (weights+grads+optimizer {_gib(static)} over "
        f"{own.state.shards} GPU(s), FSDP's gathered layers {_gib(fsdp_working_bytes(work.shape, True))}, "
        f"activations of one {work.longest}-token sequence{split} "
        f"{_gib(share * work.activation_bytes(True))}, log-prob chunk {_gib(logits)}) but has "
        f"{memory.describe()}; use more GPUs (FSDP shards the state over them), "
        f"{key}.fsdp_config.model_dtype=bf16, shorter sequences (data.max_prompt_length + data.max_response_length "
        f"= {work.longest}), LoRA (model.lora_rank) or fsdp_config.offload_policy=true"
    )


def decide(work: Workload, choices: RoleChoices, memory: GpuMemory, static_update: int,
           static_forward: int) -> Decision:
    """Checkpointing and the open budgets of one model on one GPU; raises MemoryPlanError when a derived budget
    cannot hold the longest sequence."""
    decision = Decision(checkpointing=bool(choices.checkpointing))
    if choices.checkpointing is None:
        peak = work.update_peak(static_update, choices.target_tokens, checkpointing=False)
        decision.checkpointing = peak > memory.usable
        verdict = ">" if decision.checkpointing else "≤"
        decision.notes.append(
            f"gradient checkpointing auto → {'on' if decision.checkpointing else 'off'} (estimated peak without it "
            f"{_gib(peak)} {verdict} {memory.describe()}, for micro-batches of {choices.target_tokens} tokens per "
            "GPU)")
    if choices.update_budget_key:
        budget = work.update_budget(static_update, memory, decision.checkpointing)
        _require_longest(budget, work, choices.update_budget_key, decision.checkpointing)
        decision.update_budget = budget
        decision.notes.append(
            f"{choices.update_budget_key} auto → {budget}{micro_batch_note(budget, work.sp)} ({memory.describe()}; "
            f"resident in the update {_gib(static_update)} of weights, gradients and optimizer states; activations "
            f"{work.activation_bytes(decision.checkpointing) / MIB:.2f} MiB/token with checkpointing "
            f"{'on' if decision.checkpointing else 'off'}; estimated peak "
            f"{_gib(work.update_peak(static_update, budget, decision.checkpointing))})")
    if choices.forward_budget_keys:
        budget = work.forward_budget(static_forward, memory)
        for key in choices.forward_budget_keys:
            _require_longest(budget, work, key, None)
        decision.forward_budget = budget
        decision.notes.append(
            f"{', '.join(choices.forward_budget_keys)} auto → {budget}{micro_batch_note(budget, work.sp)} (resident "
            f"{_gib(static_forward)}; {forward_activation_bytes(work.shape, work.compiled) / MIB:.3f} MiB/token "
            "without gradients)")
    return decision


def micro_batch_note(budget: int, sp: int) -> str:
    """How many tokens a micro-batch of per-GPU `budget` holds, said when Ulysses multiplies it."""
    return f" per GPU (micro-batches of {micro_batch_token_limit(budget, sp)} tokens over {sp} GPUs)" if sp > 1 else ""


def _require_longest(budget: int, work: Workload, key: str, checkpointing: bool | None) -> None:
    if micro_batch_token_limit(budget, work.sp) >= work.longest:
        return
    how = "" if checkpointing is None else f" with gradient checkpointing {'on' if checkpointing else 'off'}"
    raise MemoryPlanError(
        f"{key} auto → {budget} tokens{micro_batch_note(budget, work.sp)} from the GPU's free memory{how}, smaller "
        "than the longest sequence, "
        f"data.max_prompt_length + data.max_response_length = {work.longest} tokens: a micro-batch must hold one; "
        "free memory (offload the other models: fsdp_config.param_offload / optimizer_offload), use more GPUs, "
        "shorter sequences, or enable gradient checkpointing if it is off")
