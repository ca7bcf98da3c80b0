"""On resume the optimizer's moments and the schedule's position come from the checkpoint, its hyper-parameters
(lr, betas, weight decay, schedule shape) from the new config: a changed lr really trains at the new lr."""

from __future__ import annotations

import copy

import pytest
import torch

from verlx.config.engine import OptimConfig
from verlx.workers.checkpoint_state import (
    load_rank_state,
    optimizer_settings,
    restore_optimizer_settings,
    save_rank_state,
)
from verlx.workers.fsdp.model_builder import build_lr_scheduler, build_optimizer


def _train(layer, optimizer, scheduler, steps):
    for i in range(steps):
        optimizer.zero_grad()
        layer(torch.full((3, 4), float(i + 1))).pow(2).sum().backward()
        optimizer.step()
        if scheduler is not None:
            scheduler.step()


def _resume(layer, saved_optimizer_state, ckpt_dir, optim_cfg, total_steps):
    """What FSDPCheckpointManager.load does, without the sharding: settings kept, state loaded, schedule resumed."""
    optimizer = build_optimizer(layer.parameters(), optim_cfg)
    scheduler = build_lr_scheduler(optimizer, optim_cfg, total_steps)
    settings = optimizer_settings(optimizer)
    optimizer.load_state_dict(saved_optimizer_state)
    restore_optimizer_settings(optimizer, settings)
    load_rank_state(str(ckpt_dir), scheduler)
    return optimizer, scheduler


def test_changed_lr_betas_and_weight_decay_take_effect_and_moments_are_kept(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    old = OptimConfig(lr=1e-3, weight_decay=0.01, betas=[0.9, 0.999], lr_warmup_steps=4)
    optimizer = build_optimizer(layer.parameters(), old)
    scheduler = build_lr_scheduler(optimizer, old, total_steps=10)
    _train(layer, optimizer, scheduler, steps=2)
    save_rank_state(str(tmp_path), scheduler)
    saved = copy.deepcopy(optimizer.state_dict())

    new = OptimConfig(lr=5e-3, weight_decay=0.1, betas=[0.8, 0.99], lr_warmup_steps=4)
    resumed_layer = copy.deepcopy(layer)
    resumed, resumed_scheduler = _resume(resumed_layer, copy.deepcopy(saved), tmp_path, new, total_steps=10)
    group = resumed.param_groups[0]
    # two steps into a 4-step warm-up: factor 3/4 of the NEW peak lr
    assert group["lr"] == pytest.approx(5e-3 * 3 / 4) and resumed_scheduler.get_last_lr() == [group["lr"]]
    assert group["betas"] == (0.8, 0.99) and group["weight_decay"] == 0.1
    assert resumed_scheduler.last_epoch == 2

    # the next update equals one of the original optimizer (same moments) switched to the new settings by hand
    ref_layer = copy.deepcopy(layer)
    reference = torch.optim.AdamW(ref_layer.parameters())
    reference.load_state_dict(saved)
    reference.param_groups[0].update(lr=5e-3 * 3 / 4, betas=(0.8, 0.99), weight_decay=0.1)
    _train(resumed_layer, resumed, resumed_scheduler, steps=1)
    _train(ref_layer, reference, None, steps=1)
    for got, want in zip(resumed_layer.parameters(), ref_layer.parameters()):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-7)
    assert resumed_scheduler.get_last_lr() == pytest.approx([5e-3])  # warm-up over at step 3 of 4: factor 4/4


def test_unchanged_settings_resume_exactly(tmp_path):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    cfg = OptimConfig(lr=2e-3, lr_scheduler_type="cosine", lr_warmup_steps=1)
    optimizer = build_optimizer(layer.parameters(), cfg)
    scheduler = build_lr_scheduler(optimizer, cfg, total_steps=6)
    _train(layer, optimizer, scheduler, steps=3)
    save_rank_state(str(tmp_path), scheduler)
    resumed, resumed_scheduler = _resume(copy.deepcopy(layer), copy.deepcopy(optimizer.state_dict()), tmp_path, cfg, 6)
    assert resumed_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert resumed.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
