"""verlx's algorithms against veRL 0.9.1's own functions on random inputs: advantage estimators, policy losses (value,
gradient, metrics), KL estimators (value, gradient), loss aggregation, the value loss and rollout correction.

veRL is imported from its unpacked wheel (--verl) with the pure-Python packages it imports that verlx's environment
lacks (--deps, e.g. `pip install --no-deps --target DIR tensordict==0.10.0 pyvers cloudpickle codetiming orjson`);
nothing is fetched here. Prints max |verlx - veRL| per case and exits 1 when one exceeds --tolerance, 2 when veRL
cannot be imported. The inputs avoid the cases where verlx deliberately differs (docs/algorithms.md, docs/async.md):
every group has at least 2 samples, every response at least one token, k1 rejection bounds are symmetric.

    python benchmarks/verl_crosscheck.py --verl /tmp/verl091 --deps /tmp/verl_deps
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator

import numpy as np
import torch

B, R, GROUP = 16, 12, 4  # rows, response length, samples per prompt
Case = tuple[str, float]
# same name, different definition, on purpose (docs/algorithms.md): printed, never failing
DOCUMENTED_DIFFERENCES = {
    "loss kl_cov token-mean: ppo_kl": "veRL's kl_cov logs mean |log r| as ppo_kl; verlx's ppo_kl is mean(old - new) "
                                      "for every loss",
}


def import_verl(paths: list[str]):
    """veRL's core_algos and rollout_corr_helper, or SystemExit(2) naming what is missing."""
    sys.path[:0] = [p for p in paths if p]
    try:
        from verl.trainer.ppo import core_algos, rollout_corr_helper
    except ImportError as e:
        print(f"cannot import veRL ({e}); pass --verl (the unpacked verl wheel) and --deps (its pure-Python "
              "dependencies)", file=sys.stderr)
        raise SystemExit(2) from None
    return core_algos, rollout_corr_helper


def diff(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a - b).abs().max()) if a.numel() else 0.0


class Inputs:
    """One random batch: B responses in groups of GROUP, lengths 1..R, outcome rewards on the last token."""

    def __init__(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(1, R + 1, (B,), generator=g)
        self.mask = (torch.arange(R)[None, :] < lengths[:, None]).double()
        self.index = np.array([f"p{i // GROUP}" for i in range(B)], dtype=object)
        scores = torch.randint(0, 3, (B,), generator=g).double()
        self.rewards = torch.zeros(B, R, dtype=torch.float64)
        self.rewards[torch.arange(B), lengths - 1] = scores
        self.values = torch.randn(B, R, generator=g, dtype=torch.float64) * self.mask
        self.log_prob = -torch.rand(B, R, generator=g, dtype=torch.float64) * 3 - 0.01
        self.old = self.log_prob + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.3
        self.ref = self.log_prob + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.5
        self.rollout = self.old + torch.randn(B, R, generator=g, dtype=torch.float64) * 0.2
        self.advantages = torch.randn(B, R, generator=g, dtype=torch.float64) * self.mask
        self.weights = (torch.rand(B, R, generator=g, dtype=torch.float64) * 1.5 + 0.5) * self.mask
        self.sum_pi_squared = torch.rand(B, R, generator=g, dtype=torch.float64) * 0.9 + 0.05
        self.baselines = torch.randn(B, generator=g, dtype=torch.float64)
        self.components = {"fmt": torch.randint(0, 2, (B,), generator=g).float(),
                           "acc": torch.rand(B, generator=g) * 3}
        self.lengths = lengths


# ---------------------------------------------------------------------- advantage estimators
def estimator_cases(core, x: Inputs) -> Iterator[Case]:
    from verl.trainer.config import AlgoConfig

    from verlx.algorithms.advantages import ADV_ESTIMATORS

    common = dict(token_level_rewards=x.rewards, response_mask=x.mask)
    cases = {
        "gae": (dict(values=x.values, gamma=0.9, lam=0.8), dict(values=x.values, gamma=0.9, lam=0.8)),
        "grpo": (dict(index=x.index), dict(index=x.index)),
        "grpo (Dr.GRPO)": (dict(index=x.index, norm_adv_by_std_in_grpo=False),
                           dict(index=x.index, norm_adv_by_std_in_grpo=False)),
        "grpo_passk": (dict(index=x.index), dict(index=x.index, config=AlgoConfig())),
        "rloo": (dict(index=x.index), dict(index=x.index)),
        "opo": (dict(index=x.index), dict(index=x.index)),
        "gpg": (dict(index=x.index), dict(index=x.index)),
        "reinforce_plus_plus": (dict(gamma=0.9), dict(config=AlgoConfig(gamma=0.9))),
        "reinforce_plus_plus_baseline": (dict(index=x.index), dict(index=x.index)),
        "remax": (dict(reward_baselines=x.baselines), dict(reward_baselines=x.baselines)),
    }
    for label, (ours, theirs) in cases.items():
        name = label.split(" ")[0]
        a, r = ADV_ESTIMATORS.get(name)(**common, **ours)
        va, vr = core.get_adv_estimator_fn(name)(**common, **{k: _clone(v) for k, v in theirs.items()})
        yield f"adv {label}: advantages", diff(a, va * x.mask)
        yield f"adv {label}: returns", diff(r * x.mask, vr * x.mask)
    yield from _gdpo_case(core, x)
    otb = dict(index=x.index, old_log_probs=x.old, sum_pi_squared=x.sum_pi_squared)
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        for label, weights in (("", None), (" + IS weights", x.weights)):
            a, r = ADV_ESTIMATORS.get(name)(**common, **otb, rollout_is_weights=weights)
            va, vr = core.get_adv_estimator_fn(name)(**common, **otb, rollout_is_weights=weights)
            yield f"adv {name}{label}: advantages", diff(a, va)
            yield f"adv {name}{label}: returns", diff(r, vr * x.mask)


def _clone(v):
    return v.clone() if isinstance(v, torch.Tensor) else v


def _gdpo_case(core, x: Inputs) -> Iterator[Case]:
    from verl.trainer.config import AlgoConfig

    from verlx.algorithms.advantages import ADV_ESTIMATORS

    prompts = torch.zeros(B, 3, dtype=torch.long)
    attention = torch.cat([torch.ones(B, 3), x.mask.float()], dim=-1).long()
    config = AlgoConfig(gdpo_reward_keys=["fmt", "acc"], gdpo_reward_weights=[1.0, 0.5])
    va, _ = core.get_adv_estimator_fn("gdpo")(
        token_level_rewards=x.rewards.float(), response_mask=x.mask.float(), index=x.index, config=config,
        non_tensor_batch={k: v.numpy() for k, v in x.components.items()},
        batch={"prompts": prompts, "attention_mask": attention})
    a, _ = ADV_ESTIMATORS.get("gdpo")(response_mask=x.mask, index=x.index, reward_components=x.components,
                                      gdpo_reward_weights=[1.0, 0.5])
    yield "adv gdpo: advantages (veRL computes in float32)", diff(a, va)


# ---------------------------------------------------------------------- policy losses
def _actor_configs(mode: str, verl_correction=None, **overrides):
    from verl.workers.config import ActorConfig as VerlActor
    from verl.workers.config import PolicyLossConfig as VerlPolicyLoss

    from verlx.config.roles import ActorConfig, PolicyLossConfig

    clip = dict(clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, tau_pos=1.0,
                tau_neg=1.05)
    clip.update(overrides)
    loss = dict(loss_mode=mode, dro_beta=0.3, kl_cov_ratio=0.2, ppo_kl_coef=0.5)
    extra = {} if verl_correction is None else {"rollout_correction": verl_correction}
    theirs = VerlActor(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1,
                       policy_loss=VerlPolicyLoss(**loss, **extra), **clip)
    return ActorConfig(policy_loss=PolicyLossConfig(**loss), **clip), theirs


POLICY_LOSS_CASES = [  # (mode, loss_agg_mode, actor overrides)
    ("vanilla", "token-mean", {}), ("vanilla", "seq-mean-token-sum", {}), ("gspo", "seq-mean-token-mean", {}),
    ("gspo", "token-mean", {}), ("geo_mean", "token-mean", {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4}),
    ("sapo", "token-mean", {}), ("dppo_tv", "token-mean", {}), ("dppo_kl", "token-mean", {"clip_ratio_low": 0.05,
                                                                                          "clip_ratio_high": 0.05}),
    ("dro", "seq-mean-token-mean", {}), ("cispo", "token-mean", {}), ("gpg", "token-sum", {}),
    ("kl_cov", "token-mean", {}),
]


def policy_loss_cases(core, x: Inputs) -> Iterator[Case]:
    from verlx.algorithms.policy_losses import POLICY_LOSSES

    for mode, agg, overrides in POLICY_LOSS_CASES:
        ours_cfg, verl_cfg = _actor_configs(mode, **overrides)
        for label, weights in (("", None), (" + IS weights", x.weights)):
            lp_ours, lp_verl = x.log_prob.clone().requires_grad_(), x.log_prob.clone().requires_grad_()
            extra = {} if weights is None else {"weights": weights}
            loss, metrics = POLICY_LOSSES.get(mode)(x.old, lp_ours, x.advantages, x.mask, agg, ours_cfg, **extra)
            vloss, vmetrics = core.get_policy_loss_fn(mode)(x.old, lp_verl, x.advantages, x.mask, agg, verl_cfg,
                                                            rollout_is_weights=weights)
            loss.backward()
            vloss.backward()
            yield f"loss {mode} {agg}{label}: value", diff(loss.detach(), vloss.detach())
            yield f"loss {mode} {agg}{label}: gradient", diff(lp_ours.grad, lp_verl.grad)
            for name in (k for k in metrics if f"actor/{k}" in vmetrics):  # veRL's gpg returns none
                yield f"loss {mode} {agg}{label}: {name}", diff(metrics[name].detach(), vmetrics[f"actor/{name}"])
    yield from _bypass_cases(core, x)


def _bypass_cases(core, x: Inputs) -> Iterator[Case]:
    from verl.trainer.config.algorithm import RolloutCorrectionConfig as VerlCorrection

    from verlx.algorithms.policy_losses import select_policy_loss
    from verlx.config.run import RolloutCorrectionConfig

    for loss_type in ("ppo_clip", "reinforce"):
        settings = dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k3,token_k2",
                        rollout_rs_threshold="0.05,0.5", loss_type=loss_type)
        ours_cfg, verl_cfg = _actor_configs("vanilla", VerlCorrection(bypass_mode=True, **settings))
        loss_fn = select_policy_loss(ours_cfg, RolloutCorrectionConfig(bypass_mode=True, **settings))
        lp_ours, lp_verl = x.log_prob.clone().requires_grad_(), x.log_prob.clone().requires_grad_()
        loss, metrics = loss_fn(x.rollout, lp_ours, x.advantages, x.mask, "token-mean", ours_cfg)
        vloss, vmetrics = core.get_policy_loss_fn("bypass_mode")(x.rollout, lp_verl, x.advantages, x.mask,
                                                                 "token-mean", verl_cfg)
        loss.backward()
        vloss.backward()
        yield f"bypass_mode {loss_type}: value", diff(loss.detach(), vloss.detach())
        yield f"bypass_mode {loss_type}: gradient", diff(lp_ours.grad, lp_verl.grad)
        for name in ("rollout_corr/kl", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/chi2_token"):
            yield f"bypass_mode {loss_type}: {name}", diff(metrics[name].detach(), vmetrics[name])


# ---------------------------------------------------------------------- KL, aggregation, value loss
def kl_cases(core, x: Inputs) -> Iterator[Case]:
    from verlx.algorithms.kl import kl_penalty

    for name in ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3", "kl+", "k1+", "abs+", "mse+", "k2+",
                 "low_var_kl+", "k3+"):
        ours, theirs = x.log_prob.clone().requires_grad_(), x.log_prob.clone().requires_grad_()
        value, vvalue = kl_penalty(ours, x.ref, name), core.kl_penalty(theirs, x.ref, name)
        (value * x.advantages).sum().backward()
        (vvalue * x.advantages).sum().backward()
        yield f"kl {name}: value", diff(value.detach(), vvalue.detach())
        yield f"kl {name}: gradient", diff(ours.grad, theirs.grad)


def aggregation_cases(core, x: Inputs) -> Iterator[Case]:
    from verlx.algorithms.core import LOSS_AGG_MODES, agg_loss, compute_value_loss

    loss = x.advantages + x.values
    dp, tokens, seqs = 4, float(x.mask.sum()) * 3, float((x.mask.sum(-1) > 0).sum()) * 3
    for mode in LOSS_AGG_MODES:
        ours = agg_loss(loss, x.mask, mode, num_tokens=tokens / dp, num_seqs=seqs / dp, norm_length=30, dp_size=dp)
        theirs = core.agg_loss(loss, x.mask, mode, dp_size=dp, batch_num_tokens=tokens, global_batch_size=seqs,
                               loss_scale_factor=30)
        yield f"agg_loss {mode} (dp 4, global counts)", diff(ours, theirs)
        yield f"agg_loss {mode} (local)", diff(agg_loss(loss, x.mask, mode), core.agg_loss(loss, x.mask, mode))
    ours = compute_value_loss(x.values + 0.3 * x.advantages, x.rewards, x.values, x.mask, 0.2)
    theirs = core.compute_value_loss(x.values + 0.3 * x.advantages, x.rewards, x.values, x.mask, 0.2)
    yield "value loss: loss", diff(ours[0], theirs[0])
    yield "value loss: clipfrac", diff(ours[1], theirs[1])


# ---------------------------------------------------------------------- rollout correction
def rollout_correction_cases(helper, x: Inputs) -> Iterator[Case]:
    from verlx.algorithms.rollout_correction import is_weights, offpolicy_metrics, parse_rs_thresholds, rejection_mask

    log_ratio = x.old - x.rollout
    for level in ("token", "sequence"):
        for normalize in (False, True):
            ours, _ = is_weights(log_ratio, x.mask, level, 2.0, normalize)
            theirs, _ = helper.compute_rollout_correction_weights(log_ratio, x.mask, level, 2.0, normalize)
            yield f"IS weights {level}{' batch-normalized' if normalize else ''}", diff(ours, theirs)
    thresholds = {"token_k1": "0.8_1.25", "seq_sum_k1": "0.5_2.0", "seq_mean_k1": "0.9_1.1111111111111112",
                  "token_k2": "0.02", "seq_sum_k2": "0.1", "seq_mean_k2": "0.02", "seq_max_k2": "0.05",
                  "token_k3": "0.02", "seq_sum_k3": "0.1", "seq_mean_k3": "0.02", "seq_max_k3": "0.05"}
    for option, threshold in thresholds.items():
        ours, _ = rejection_mask(log_ratio, x.mask, parse_rs_thresholds([option], threshold))
        theirs, _ = helper.compute_rollout_rejection_mask(log_ratio, x.mask, option, threshold)
        yield f"rejection mask {option} ({threshold})", diff(ours * x.mask, theirs)
    ours = offpolicy_metrics(x.old, x.rollout, x.mask)
    theirs = helper.compute_offpolicy_metrics(x.old, x.rollout, x.mask)
    for name, value in ours.items():
        yield f"rollout_corr/{name}", diff(value, theirs[name])


GROUPS: dict[str, Callable] = {"estimators": estimator_cases, "policy losses": policy_loss_cases,
                               "kl": kl_cases, "aggregation": aggregation_cases}


def run(verl_paths: list[str], seeds: int, tolerance: float) -> int:
    core, helper = import_verl(verl_paths)
    worst: dict[str, float] = {}
    for seed in range(seeds):
        x = Inputs(seed)
        cases = [group(core, x) for group in GROUPS.values()] + [rollout_correction_cases(helper, x)]
        for generator in cases:
            for name, value in generator:
                worst[name] = max(worst.get(name, 0.0), value)
    width = max(len(n) for n in worst)
    known = {n: v for n, v in worst.items() if n.replace(" + IS weights", "") in DOCUMENTED_DIFFERENCES}
    compared = {n: v for n, v in worst.items() if n not in known}
    failed = [n for n, v in compared.items() if not v <= tolerance]
    for name, value in compared.items():
        print(f"{name:<{width}}  {value:.3g}{'   > tolerance' if name in failed else ''}")
    for name, value in known.items():
        reason = DOCUMENTED_DIFFERENCES[name.replace(" + IS weights", "")]
        print(f"{name:<{width}}  {value:.3g}   documented difference: {reason}")
    print(f"\n{len(compared)} cases over {seeds} random batches; largest difference "
          f"{max(compared.values()):.3g}; {len(failed)} above {tolerance:g}; {len(known)} documented differences")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verl", default=os.environ.get("VERL_PATH", "/tmp/verl091"),
                        help="directory holding the unpacked veRL 0.9.1 wheel (its verl/ package)")
    parser.add_argument("--deps", default=os.environ.get("VERL_DEPS", ""),
                        help="directory with veRL's pure-Python dependencies missing here (pip --target)")
    parser.add_argument("--seeds", type=int, default=5, help="random batches per case")
    parser.add_argument("--tolerance", type=float, default=1e-5,
                        help="largest allowed |verlx - veRL| (float32 paths in veRL set the scale)")
    args = parser.parse_args(argv)
    return run([args.verl, args.deps], args.seeds, args.tolerance)


if __name__ == "__main__":
    sys.exit(main())
