"""Deciding a resume before any worker starts: which checkpoint (verified), what changed since it was saved, and
whether there is anything left to train.

Every setting of a run is either one whose new value takes effect from the resumed step on (learning rate and the
other optimizer hyper-parameters, clip ratios, KL and entropy coefficients, step/epoch totals, frequencies,
logging, rollout sampling, ...) or one that must match the checkpoint because the saved state or the saved data
position would mean something else under a new value (strategy, optimizer type, the model and its LoRA adapters,
the data, batch size and seed). RESUME_RULES says which; a change of the first kind is logged, one line per key, a
change of the second kind is refused with the list of keys.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from dataclasses import dataclass, field

from verlx.config.loader import ConfigError
from verlx.trainer import checkpointing
from verlx.utils.errors import VerlxError
from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)

TAKES_EFFECT = "takes effect"
MUST_MATCH = "must match"
NOT_COMPARED = "not compared"

_DATA_ORDER = "the saved data position counts rows of this data, in this order"
_STEP_SIZE = "a step is train_batch_size prompts × rollout.n samples: the saved step count and data position mean that"
_STATE_LAYOUT = "the saved model and optimizer shards are in this strategy's layout"
_OPTIMIZER = "the saved optimizer state is this optimizer's"
_START = "the run started from this model, and its reference model is loaded from it again"
_ADAPTERS = "the saved LoRA weights have this shape and scaling"
_MODEL = "the saved weights belong to this model definition"
_ROLLOUT_MODE = ("samples generated ahead of the trainer are not saved: a resumed run regenerates them from the saved "
                 "data position, whatever the mode, placement and bounds (docs/async.md)")

# Dotted key or section → (policy, why). The longest entry that is a prefix of a key decides.
RESUME_RULES: dict[str, tuple[str, str]] = {
    **{section: (TAKES_EFFECT, "") for section in (
        "data", "actor_rollout_ref", "critic", "reward_model", "reward", "custom_reward_function", "algorithm",
        "trainer", "ray_kwargs", "rollout", "global_profiler", "distillation")},
    **{key: (MUST_MATCH, _DATA_ORDER) for key in (
        "data.train_files", "data.train_max_samples", "data.prompt_key", "data.shuffle", "data.seed",
        "data.filter_overlong_prompts", "data.skip_bad_rows", "trainer.seed", "data.custom_cls", "data.sampler")},
    "data.train_batch_size": (MUST_MATCH, _STEP_SIZE),
    "actor_rollout_ref.rollout.n": (MUST_MATCH, _STEP_SIZE),
    "actor_rollout_ref.actor.strategy": (MUST_MATCH, _STATE_LAYOUT),
    "critic.strategy": (MUST_MATCH, _STATE_LAYOUT),
    "actor_rollout_ref.actor.megatron.use_distributed_optimizer": (MUST_MATCH, _OPTIMIZER),
    "critic.megatron.use_distributed_optimizer": (MUST_MATCH, _OPTIMIZER),
    "actor_rollout_ref.actor.optim.optimizer": (MUST_MATCH, _OPTIMIZER),
    "critic.optim.optimizer": (MUST_MATCH, _OPTIMIZER),
    "actor_rollout_ref.model.path": (MUST_MATCH, _START),
    "actor_rollout_ref.model.lora_adapter_path": (MUST_MATCH, _START),
    "actor_rollout_ref.model.tokenizer_path": (MUST_MATCH, "the model was trained on this tokenizer's ids"),
    "actor_rollout_ref.model.override_config": (MUST_MATCH, _MODEL),
    "critic.model.path": (MUST_MATCH, _START),
    "critic.model.override_config": (MUST_MATCH, _MODEL),
    **{f"{role}.{key}": (MUST_MATCH, _ADAPTERS) for role in ("actor_rollout_ref.model", "critic.model")
       for key in ("lora_rank", "lora_alpha", "target_modules", "exclude_modules")},
    **{key: (TAKES_EFFECT, _ROLLOUT_MODE) for key in (
        "trainer.rollout_mode", "trainer.max_staleness", "trainer.staleness_policy", "trainer.partial_rollout",
        "actor_rollout_ref.hybrid_engine", "rollout", "algorithm.rollout_correction")},
    # how this run was started, not what it trains
    "trainer.resume_mode": (NOT_COMPARED, ""),
    "trainer.resume_from_path": (NOT_COMPARED, ""),
    "trainer.allow_finished_resume": (NOT_COMPARED, ""),
}

_ARCHITECTURE_KEYS = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")


class _Unset:
    """A key one of the two configs does not have."""

    def __repr__(self) -> str:
        return "(unset)"


_UNSET = _Unset()


def rule_for(key: str) -> tuple[str, str] | None:
    parts = key.split(".")
    for n in range(len(parts), 0, -1):
        rule = RESUME_RULES.get(".".join(parts[:n]))
        if rule is not None:
            return rule
    return None


@dataclass
class Change:
    key: str
    before: object
    after: object
    policy: str
    why: str

    def __str__(self) -> str:
        return f"{self.key}: {_show(self.before)} -> {_show(self.after)}"


def _show(value) -> str:
    return repr(value) if value is _UNSET else json.dumps(value)


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """Dotted key → leaf value (an empty free-form section has no leaves: its entries are compared one by one)."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_changes(saved: dict, now: dict) -> list[Change]:
    """Every setting that differs between a checkpoint's config.json and this run's config, with its rule. A key
    the checkpoint does not record (saved by an older verlx) is compared only when a new value takes effect."""
    before, after = flatten(saved), flatten(json.loads(json.dumps(now, default=str)))
    changes = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key, _UNSET), after.get(key, _UNSET)
        rule = rule_for(key)
        if old == new or rule is None or rule[0] == NOT_COMPARED:
            continue
        if rule[0] == MUST_MATCH and (old is _UNSET or new is _UNSET):
            continue
        changes.append(Change(key, old, new, *rule))
    return changes


def architecture_changes(path: str, hf_config) -> list[str]:
    """Model-shape differences between the checkpoint's saved HF config and the model at model.path."""
    hf_path = os.path.join(path, "actor", "huggingface", "config.json")
    if not os.path.exists(hf_path) or hf_config is None:
        return []
    with open(hf_path) as f:
        saved_hf = json.load(f)
    return [f"model config {key}: {saved_hf[key]!r} in the checkpoint, {getattr(hf_config, key, None)!r} in "
            "actor_rollout_ref.model.path" for key in _ARCHITECTURE_KEYS
            if saved_hf.get(key) is not None and saved_hf[key] != getattr(hf_config, key, None)]


class ResumeRefused(ConfigError):
    """Settings that must match the checkpoint differ from it (exit code 2, like every config error)."""

    def __init__(self, path: str, problems: list[str]):
        super().__init__(problems)
        lines = "\n".join(f"  - {p}" for p in problems)
        self.args = (f"cannot resume from {path}: these settings must match the checkpoint:\n{lines}\n"
                     "Restore them, or start a new run: trainer.resume_mode=disable (starts from "
                     "actor_rollout_ref.model.path) or another trainer.default_local_dir",)


class NothingToDo(VerlxError):
    """The checkpoint resumed from is already at (or past) the last step of this run."""


@dataclass
class ResumePoint:
    path: str
    state: dict
    changed_keys: set[str] = field(default_factory=set)
    finished: bool = False


def _saved_config(path: str) -> dict | None:
    saved_path = os.path.join(path, "config.json")
    if not os.path.exists(saved_path):
        logger.warning("%s has no config.json: its settings cannot be compared with this run's", path)
        return None
    with open(saved_path) as f:
        return json.load(f)


def check_settings(path: str, config, hf_config, use_critic: bool) -> list[Change]:
    """Refuse changes that break the checkpoint; log (and return) those that take effect."""
    saved = _saved_config(path)
    changes = config_changes(saved, dataclasses.asdict(config)) if saved is not None else []
    problems = [f"{c.key}: {_show(c.before)} in the checkpoint, {_show(c.after)} now ({c.why})"
                for c in changes if c.policy == MUST_MATCH]
    problems += architecture_changes(path, hf_config)
    if use_critic and not os.path.isdir(os.path.join(path, "critic")):
        problems.append(f"this run trains a critic (algorithm.adv_estimator={config.algorithm.adv_estimator}) "
                        "but the checkpoint has none")
    if problems:
        raise ResumeRefused(path, problems)
    taking_effect = [c for c in changes if c.policy == TAKES_EFFECT]
    for change in taking_effect:
        logger.info("resuming from %s: changed since the checkpoint: %s (takes effect)", path, change)
    return taking_effect


def plan_resume(config, hf_config, total_steps: int, use_critic: bool, mode: str | None = None) -> ResumePoint | None:
    """The verified checkpoint to resume from with its driver state, or None to start fresh; `mode` overrides
    trainer.resume_mode (a restart resumes with `auto`). Raises ConfigError for a damaged explicit path or for
    settings that must match the checkpoint."""
    t = config.trainer
    checkpointing.remove_stale_temps(expand_path(t.default_local_dir, absolute=True))
    path = checkpointing.resolve_resume_path(t, mode)
    if path is None:
        return None
    changed = check_settings(path, config, hf_config, use_critic)
    state = checkpointing.read_driver_state(path)
    step = state["global_step"]
    logger.info("resuming from %s at step %d of %d", path, step, total_steps)
    return ResumePoint(path, state, {c.key for c in changed}, finished=step >= total_steps and not t.val_only)


def stop_if_finished(point: ResumePoint | None, trainer_cfg, total_steps: int) -> bool:
    """True when the run resumes at its last step and trainer.allow_finished_resume says that is fine; raises
    NothingToDo when it does not. A run that trains 0 steps and exits 0 hides a forgotten experiment_name change."""
    if point is None or not point.finished:
        return False
    message = f"nothing to do: already at step {point.state['global_step']} of {total_steps} (checkpoint {point.path})"
    if not trainer_cfg.allow_finished_resume:
        raise NothingToDo(
            f"{message}. To train further raise trainer.total_training_steps (or trainer.total_epochs); to start "
            "a new run use another trainer.experiment_name or trainer.resume_mode=disable; "
            "trainer.allow_finished_resume=true makes this case exit with 0")
    logger.warning("%s; exiting (trainer.allow_finished_resume=true)", message)
    return True
