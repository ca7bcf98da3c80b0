"""Loading megatron-core's optimizer state where its inner optimizer is torch's Adam (no transformer-engine, no apex).

megatron-core 0.16 picks torch.optim.Adam(W) when neither transformer-engine's nor apex's FusedAdam is installed.
Those keep Adam's step in every parameter's state (FusedAdam keeps it per group), and three places of megatron's
distributed optimizer handle that wrongly (the resume of the 2 x H100 run of 2026-11-26 failed with a bare
AssertionError, the first of them):
  - building the state dict to load into reads the step of every parameter and asserts there is exactly one;
    an optimizer that has not stepped yet (every resume's) has none;
  - the parameter-state load of the layout-independent format (fully_reshardable) fills every key of a
    parameter's state, the step included, from the loaded tensors, which leave the step out: KeyError 'step';
  - the step is restored as one tensor shared by all parameters, which Adam increments in place once per
    parameter per update: the bias corrections after a resume would be those of a step count far too large.
Everything else goes through megatron's own load, and optimizers on FusedAdam load through it unchanged.
"""

from __future__ import annotations

import torch


def _parts(optimizer) -> list:
    """The megatron optimizers of a chained one (one per parameter group kind), or the optimizer itself."""
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def _torch_adam(part):
    adam = part.optimizer
    return adam if isinstance(adam, torch.optim.Adam | torch.optim.AdamW) else None


def allocate_optimizer_state(optimizer) -> None:
    """Zero moments and step for every parameter of a torch Adam that has not stepped yet, so that megatron can
    build the state dict a checkpoint loads into. The load overwrites them."""
    if optimizer is None:
        return
    for part in _parts(optimizer):
        adam = _torch_adam(part)
        if adam is None:
            continue
        for group in adam.param_groups:
            for param in group["params"]:
                state = adam.state[param]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(param)
                    state["exp_avg_sq"] = torch.zeros_like(param)


def load_optimizer_state(optimizer, state: dict) -> None:
    """megatron's load_state_dict, with the parameter state of a distributed optimizer on torch Adam loaded while
    the step is set aside, and one step tensor per parameter after."""
    parts = _parts(optimizer)
    if not any(_torch_adam(part) is not None for part in parts):
        optimizer.load_state_dict(state)
        return
    states = [state] if len(parts) == 1 else [value for _, value in sorted(state.items())]
    for part, part_state in zip(parts, states, strict=True):
        adam = _torch_adam(part)
        param_state = part_state.pop("param_state", None) if adam is not None else None
        if param_state is None:
            part.load_state_dict(part_state)
        else:
            _load_distributed(part, adam, part_state, param_state)
        if adam is not None:
            for values in adam.state.values():
                values["step"] = values["step"].clone()


def _load_distributed(part, adam, state: dict, param_state) -> None:
    sharding = state.pop("param_state_sharding_type")
    if sharding != "fully_reshardable":
        raise ValueError(f"the checkpoint's distributed-optimizer state has sharding type {sharding!r}; verlx saves "
                         "and loads fully_reshardable")
    part.load_state_dict(state)  # parameter groups, the step, the grad scaler
    steps = {param: values.pop("step") for param, values in adam.state.items()}
    part.load_parameter_state_from_fully_reshardable(param_state)
    for param, step in steps.items():
        adam.state[param]["step"] = step
