"""The valid range of each numeric key, checked before anything runs: a problem names the key, the value and the
range ("actor_rollout_ref.actor.optim.lr=-0.001 is out of range: it must be >= 0"), instead of torch or an engine
failing on it later in a worker. Every float key of a config must also be finite. null (where a key allows it) is
not checked here; keys with ranges that depend on other keys are checked by the pre-flight checks."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def contains(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        return f"{text} ({self.note})" if self.note else text


def at_least(low: float, note: str = "") -> Range:
    return Range(low=low, note=note)


def above(low: float, note: str = "") -> Range:
    return Range(low=low, low_open=True, note=note)


def unit_interval(note: str = "") -> Range:
    return Range(low=0, high=1, note=note)


_OPTIM = {"lr": at_least(0), "weight_decay": at_least(0), "lr_warmup_steps_ratio": unit_interval(),
          "min_lr_ratio": unit_interval()}
_UPDATE = {"ppo_epochs": at_least(1, "passes over each batch"), "grad_clip": above(0)}

PPO_RANGES: dict[str, Range] = {
    "data.max_prompt_length": at_least(1),
    "data.max_response_length": at_least(1, "tokens each response may have"),
    "data.filter_overlong_prompts_workers": at_least(1),
    "data.dataloader_num_workers": at_least(0),
    "data.image_patch_size": at_least(1, "pixels"),
    **{f"actor_rollout_ref.actor.optim.{k}": r for k, r in _OPTIM.items()},
    **{f"critic.optim.{k}": r for k, r in _OPTIM.items()},
    **{f"actor_rollout_ref.actor.{k}": r for k, r in _UPDATE.items()},
    **{f"critic.{k}": r for k, r in _UPDATE.items()},
    "actor_rollout_ref.actor.clip_ratio": at_least(0),
    "actor_rollout_ref.actor.kl_loss_coef": at_least(0),
    "actor_rollout_ref.actor.logprob_chunk_size": at_least(1),
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": at_least(1),
    "critic.cliprange_value": at_least(0),
    "actor_rollout_ref.actor.loss_scale_factor": above(0, "the divisor of seq-mean-token-sum-norm"),
    "critic.loss_scale_factor": above(0, "the divisor of seq-mean-token-sum-norm"),
    "critic.ulysses_sequence_parallel_size": at_least(1),
    "actor_rollout_ref.rollout.top_k": at_least(-1, "-1 = no top-k"),
    "actor_rollout_ref.rollout.max_num_seqs": at_least(1),
    "actor_rollout_ref.rollout.max_num_batched_tokens": at_least(1),
    "actor_rollout_ref.rollout.val_kwargs.temperature": at_least(0),
    "actor_rollout_ref.rollout.val_kwargs.top_p": Range(low=0, high=1, low_open=True),
    "actor_rollout_ref.rollout.val_kwargs.top_k": at_least(-1, "-1 = no top-k"),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": at_least(1),
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls": at_least(1),
    "actor_rollout_ref.rollout.multi_turn.max_tool_response_length": at_least(1),
    "actor_rollout_ref.rollout.multi_turn.tool_timeout_s": above(0),
    "actor_rollout_ref.rollout.agent.num_workers": at_least(1),
    "reward.num_workers": at_least(0, "0 scores in the driver"),
    "reward.timeout_s": above(0, "seconds one sample may take"),
    "reward.max_error_fraction": unit_interval(),
    "reward.show_errors": at_least(0),
    "algorithm.gamma": unit_interval(),
    "algorithm.lam": unit_interval(),
    "algorithm.kl_ctrl.kl_coef": at_least(0),
    "algorithm.filter_groups.max_num_gen_batches": at_least(0, "0 = no limit"),
    "trainer.critic_warmup": at_least(0),
    "trainer.log_val_generations": at_least(0),
    "trainer.phase_timeout_s": above(0, "null = no limit"),
    "trainer.max_restarts": at_least(0),
    "trainer.save_on_signal_timeout_s": above(0, "null = no limit"),
    "trainer.max_consecutive_nonfinite_updates": at_least(1),
    "ray_kwargs.ray_init.num_cpus": at_least(1),
}

SFT_RANGES: dict[str, Range] = {
    "optim.lr": at_least(0),
    "optim.weight_decay": at_least(0),
    "optim.min_lr_ratio": unit_interval(),
    "optim.clip_grad": above(0, "null = no clipping"),
    "data.val_max_samples": at_least(-1, "-1 = all rows"),
    "trainer.save_on_signal_timeout_s": above(0, "null = no limit"),
}


def _lookup(config, key: str):
    value = config
    for part in key.split("."):
        if not hasattr(value, part):
            return None
        value = getattr(value, part)
    return value


def range_problems(config, ranges: dict[str, Range]) -> list[str]:
    """A problem for each key in `ranges` whose (non-null) value is outside its range, and for each non-finite float."""
    problems = non_finite_problems(config)
    for key, valid in ranges.items():
        value = _lookup(config, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        if not valid.contains(value):
            problems.append(f"{key}={value!r} is out of range: it must be {valid}")
    return problems


def non_finite_problems(config, prefix: str = "") -> list[str]:
    """Every float leaf of a config dataclass that is nan or ±inf (Hydra reads `.nan` and `.inf` as floats)."""
    problems = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            problems += non_finite_problems(value, key + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{key}={value!r} must be a finite number")
    return problems

