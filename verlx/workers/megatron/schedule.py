"""veRL's megatron learning-rate keys (optim.lr_decay_style, lr_decay_steps, lr_warmup_init, min_lr, WSD, weight-decay
increments) → the arguments of megatron-core's OptimizerParamScheduler, with every check it asserts done first so a
bad value is named by key. Pure functions: no megatron-core import.

Semantics are megatron's (as veRL uses them): lr rises linearly from lr_warmup_init to lr over the warm-up steps
(lr_warmup_steps, else lr_warmup_steps_ratio × the decay steps), then follows lr_decay_style down to min_lr at
lr_decay_steps (default: the schedule's total steps); constant keeps lr.
"""

from __future__ import annotations

DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WD_STYLES = ("constant", "linear", "cosine")


def decay_style(optim) -> str:
    """megatron's spelling: veRL's YAML documents inverse_square_root, megatron takes inverse-square-root."""
    return "inverse-square-root" if optim.lr_decay_style == "inverse_square_root" else optim.lr_decay_style


def style_problems(key: str, optim) -> list[str]:
    """What can be checked without the run's length."""
    problems = []
    style = decay_style(optim)
    if style not in DECAY_STYLES:
        problems.append(f"{key}.lr_decay_style={optim.lr_decay_style!r} is not one of {list(DECAY_STYLES)}")
    if style == "WSD" and not optim.lr_wsd_decay_steps:
        problems.append(f"{key}.lr_decay_style=WSD needs {key}.lr_wsd_decay_steps (the steps of its final decay)")
    if optim.lr_wsd_decay_style not in WSD_STYLES:
        problems.append(f"{key}.lr_wsd_decay_style={optim.lr_wsd_decay_style!r} is not one of {list(WSD_STYLES)}")
    if optim.weight_decay_incr_style not in WD_STYLES:
        problems.append(f"{key}.weight_decay_incr_style={optim.weight_decay_incr_style!r} is not one of "
                        f"{list(WD_STYLES)}")
    if not 0 <= optim.min_lr <= optim.lr:
        problems.append(f"{key}.min_lr={optim.min_lr} must lie between 0 and {key}.lr={optim.lr}")
    if not 0 <= optim.lr_warmup_init <= optim.lr:
        problems.append(f"{key}.lr_warmup_init={optim.lr_warmup_init} must lie between 0 and {key}.lr={optim.lr}")
    if optim.lr_decay_steps is not None and optim.lr_decay_steps < 1:
        problems.append(f"{key}.lr_decay_steps={optim.lr_decay_steps} must be >= 1 (or null: the total steps)")
    return problems


def scheduler_kwargs(key: str, optim, total_steps: int) -> dict:
    """OptimizerParamScheduler's arguments; ValueError naming the keys when megatron would refuse them."""
    problems = style_problems(key, optim)
    total = optim.total_training_steps if optim.total_training_steps > 0 else total_steps
    decay_steps = optim.lr_decay_steps or total
    warmup = optim.lr_warmup_steps
    if warmup is None or warmup <= 0:
        warmup = int(optim.lr_warmup_steps_ratio * decay_steps)
    if warmup >= decay_steps:
        problems.append(f"{key}: {warmup} warm-up steps (lr_warmup_steps / lr_warmup_steps_ratio) must be fewer "
                        f"than the {decay_steps} decay steps (lr_decay_steps, else the total training steps)")
    if problems:
        raise ValueError("invalid megatron lr schedule:\n" + "\n".join(f"  - {p}" for p in problems))
    override = not optim.use_checkpoint_opt_param_scheduler
    return dict(init_lr=optim.lr_warmup_init, max_lr=optim.lr, min_lr=optim.min_lr, lr_warmup_steps=warmup,
                lr_decay_steps=decay_steps, lr_decay_style=decay_style(optim), start_wd=optim.weight_decay,
                end_wd=optim.weight_decay, wd_incr_steps=total, wd_incr_style=optim.weight_decay_incr_style,
                use_checkpoint_opt_param_scheduler=optim.use_checkpoint_opt_param_scheduler,
                override_opt_param_scheduler=override, wsd_decay_steps=optim.lr_wsd_decay_steps,
                lr_wsd_decay_style=optim.lr_wsd_decay_style)


def fsdp_problems(key: str, optim) -> list[str]:
    """megatron-only optim keys set on an FSDP role: refused (FSDP's schedule is lr_scheduler_type's)."""
    from verlx.config.engine import OptimConfig

    default = OptimConfig()
    megatron_only = ("lr_decay_style", "lr_decay_steps", "lr_warmup_init", "min_lr", "weight_decay_incr_style",
                     "lr_wsd_decay_style", "lr_wsd_decay_steps", "use_checkpoint_opt_param_scheduler",
                     "override_optimizer_config")
    return [f"{key}.{name}={getattr(optim, name)!r} is a megatron optimizer key (veRL's optim/megatron.yaml) but "
            f"the role's strategy is fsdp; use {key}.lr_scheduler_type / min_lr_ratio for FSDP's schedule"
            for name in megatron_only if getattr(optim, name) != getattr(default, name)]
