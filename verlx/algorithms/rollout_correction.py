"""Rollout correction (algorithm.rollout_correction): importance weights and rejection masks for the gap between
the policy that generated a sample (π_rollout: another engine, another precision, or older weights in the
asynchronous modes) and the policy the trainer recomputes (π_old = old_log_probs).

Everything starts from the per-token log ratio log r = log π_old − log π_rollout of the sampled tokens.

* Importance sampling (`rollout_is`, registry ROLLOUT_IS): each level maps log r to a log weight per token:
  `token` (log r itself: truncated IS, TIS), `sequence` (the sum over the response: the product of the ratios,
  broadcast to its tokens) and `geometric` (the mean over the response: the geometric mean of the ratios). The
  weight exp(log weight), bounded to [e^-20, e^20], is truncated at `rollout_is_threshold` and detached; it
  multiplies the policy-gradient loss of its token (algorithms/core.agg_loss `weights`). A threshold written
  "lower_upper" (e.g. "0.5_4.0") is IcePop instead of truncation: weights outside [lower, upper] become 0, the
  others stay as they are.
* Rejection (`rollout_rs`, registry ROLLOUT_RS): tokens or whole responses whose statistic lies outside its bounds
  are masked out of the actor's loss. Statistics per token: k1 = log r, k2 = ½(log r)², k3 = r − 1 − log r; per
  sequence the sum (`seq_sum_*`), mean (`seq_mean_*`) or max (`seq_max_*`) over the response. k1 options keep
  ratios inside [lower, upper] (`rollout_rs_threshold` "lower_upper", or one number x meaning [1/x, x]); k2/k3
  options keep statistics ≤ the threshold.

* Bypass mode (`bypass_mode`, veRL's): the trainer skips recomputing π_old and uses π_rollout as old_log_probs;
  the actor's loss is then `loss_type` (BYPASS_LOSS_TYPES: `ppo_clip`, or `reinforce` with IS weights), with the
  weights and rejection above computed per micro-batch between the current policy and π_rollout
  (algorithms/policy_losses/bypass.py).

Metrics use veRL's names under `rollout_corr/`; the off-policy diagnostics (kl, k3_kl, perplexities, chi²) are
logged whenever the engine returned log-probs, even with correction off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from verlx.algorithms.core import masked_mean, masked_sum
from verlx.utils.registry import Registry

SAFETY_BOUND = 20.0  # |log weight| is clamped here before exp: e^20 ≈ 4.9e8
KEY = "algorithm.rollout_correction"

LogWeightFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
ROLLOUT_IS: Registry[LogWeightFn] = Registry("rollout IS level", f"{KEY}.rollout_is")


def _per_sequence(values: torch.Tensor, mask: torch.Tensor, how: str) -> torch.Tensor:
    """[B] sum, mean or max of `values` over each response's valid tokens (0 for an empty response)."""
    if how == "sum":
        return masked_sum(values, mask, dim=-1)
    if how == "mean":
        return masked_mean(values, mask, dim=-1)
    peak = torch.where(mask.bool(), values, torch.full_like(values, -torch.inf)).max(dim=-1).values
    return torch.where(torch.isinf(peak), torch.zeros_like(peak), peak)


@ROLLOUT_IS.register("token")
def token_log_weight(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each token's own ratio (token-level truncated IS)."""
    return log_ratio


@ROLLOUT_IS.register("sequence")
def sequence_log_weight(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The product of the response's ratios, the same for all its tokens (sequence-level IS)."""
    return _per_sequence(log_ratio, mask, "sum")[:, None].expand_as(log_ratio)


@ROLLOUT_IS.register("geometric")
def geometric_log_weight(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The geometric mean of the response's ratios, the same for all its tokens (length-neutral sequence IS)."""
    return _per_sequence(log_ratio, mask, "mean")[:, None].expand_as(log_ratio)


# ---------------------------------------------------------------------- rejection
_DIVERGENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda lr: lr,
    "k2": lambda lr: 0.5 * lr.square(),
    "k3": lambda lr: torch.exp(lr) - 1.0 - lr,
}


@dataclass(frozen=True)
class RejectionRule:
    """A token statistic (`divergence` of log r) reduced per sequence by `reduce` (None: per token)."""

    divergence: str
    reduce: str | None

    @property
    def ratio_bounds(self) -> bool:
        """k1 statistics are log ratios: bounded on both sides (a ratio interval); k2/k3 only from above."""
        return self.divergence == "k1"

    def statistic(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[B, R]: the token's statistic, or its sequence's broadcast to every token."""
        per_token = _DIVERGENCES[self.divergence](log_ratio)
        if self.reduce is None:
            return per_token
        return _per_sequence(per_token, mask, self.reduce)[:, None].expand_as(log_ratio)


ROLLOUT_RS: Registry[RejectionRule] = Registry("rollout rejection option", f"{KEY}.rollout_rs")
for _divergence in ("k1", "k2", "k3"):
    ROLLOUT_RS.register(f"token_{_divergence}")(RejectionRule(_divergence, None))
    for _reduce in ("sum", "mean", "max"):
        if not (_reduce == "max" and _divergence == "k1"):  # the max log ratio says nothing about the low side
            ROLLOUT_RS.register(f"seq_{_reduce}_{_divergence}")(RejectionRule(_divergence, _reduce))


@dataclass(frozen=True)
class Bounds:
    lower: float | None  # lower ratio bound: k1 rejection options and IcePop; None: none (rejection) or 1/upper
    upper: float


def rs_options(spec: str | None) -> list[str]:
    """The comma-separated option names of `rollout_rs`, duplicates removed, order kept."""
    names = [part.strip() for part in (spec or "").split(",") if part.strip()]
    return list(dict.fromkeys(names))


def parse_rs_thresholds(options: list[str], spec: str | float | int | None) -> dict[str, Bounds]:
    """`rollout_rs_threshold`: one entry for all options or one per option (comma-separated); raises ValueError
    naming the key and the entry."""
    key = f"{KEY}.rollout_rs_threshold"
    if spec is None:
        raise ValueError(f"{key} is null but {KEY}.rollout_rs={','.join(options)} needs bounds (e.g. 2.0, or "
                         "'0.5_2.0' for a k1 ratio interval)")
    entries = [str(spec)] if isinstance(spec, (int, float)) else [p.strip() for p in spec.split(",") if p.strip()]
    if len(entries) == 1:
        entries = entries * len(options)
    if len(entries) != len(options):
        raise ValueError(f"{key}={spec!r} has {len(entries)} entries for {len(options)} {KEY}.rollout_rs options; "
                         "give one entry for all or one per option")
    return {option: _parse_bounds(option, entry, key) for option, entry in zip(options, entries)}


def _parse_bounds(option: str, entry: str, key: str) -> Bounds:
    rule = ROLLOUT_RS.get(option)
    try:
        numbers = [float(x) for x in entry.split("_")]
    except ValueError:
        raise ValueError(f"{key}: '{entry}' (for {option}) is not a number or 'lower_upper'") from None
    if any(not math.isfinite(x) or x <= 0 for x in numbers) or len(numbers) > 2:
        raise ValueError(f"{key}: '{entry}' (for {option}) must be one or two positive numbers")
    if not rule.ratio_bounds:
        if len(numbers) != 1:
            raise ValueError(f"{key}: {option} takes one upper bound, got '{entry}'")
        return Bounds(None, numbers[0])
    lower, upper = numbers if len(numbers) == 2 else sorted((numbers[0], 1.0 / numbers[0]))
    if not lower < upper:
        raise ValueError(f"{key}: '{entry}' (for {option}) must be lower_upper with lower < upper")
    return Bounds(lower, upper)


# ---------------------------------------------------------------------- bypass mode
# algorithm.rollout_correction.loss_type: the policy loss of bypass mode (algorithms/policy_losses/bypass.py)
BYPASS_LOSS_TYPES: Registry[Callable] = Registry("bypass-mode loss type", f"{KEY}.loss_type")
BYPASS_LOSS_TYPES.register_lazy("ppo_clip", "verlx.algorithms.policy_losses.bypass:ppo_clip")
BYPASS_LOSS_TYPES.register_lazy("reinforce", "verlx.algorithms.policy_losses.bypass:reinforce")


# ---------------------------------------------------------------------- the computation
def parse_is_threshold(spec: str | float | int) -> Bounds:
    """`rollout_is_threshold`: one number (truncation at it) or "lower_upper" (IcePop's interval); raises
    ValueError naming the key."""
    key = f"{KEY}.rollout_is_threshold"
    parts = spec.strip().split("_") if isinstance(spec, str) else [spec]
    try:
        numbers = [float(x) for x in parts]
    except ValueError:
        numbers = []
    if isinstance(spec, bool) or len(numbers) not in (1, 2):
        raise ValueError(f"{key}={spec!r} is neither a number (IS weights truncated at it, typical: 2.0) nor "
                         "'lower_upper' (IcePop: weights outside the interval set to 0, e.g. '0.5_4.0')")
    lower, upper = (None, numbers[0]) if len(numbers) == 1 else numbers
    if not (upper > 0 and math.isfinite(upper)) or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{key}={spec!r} must be a positive number: IS weights are truncated at it (typical: "
                         "2.0); or 'lower_upper' with 0 < lower <= upper")
    return Bounds(lower, upper)


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: str | float,
               batch_normalize: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Detached IS weights [B, R] (0 at padding), truncated at the threshold or, for a "lower_upper" threshold,
    set to 0 outside the interval (IcePop), and their statistics."""
    bounds = parse_is_threshold(threshold)
    log_weight = ROLLOUT_IS.get(level)(log_ratio.detach(), mask)
    raw = torch.exp(log_weight.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    upper, lower = bounds.upper, 1.0 / bounds.upper if bounds.lower is None else bounds.lower
    outside = (raw < lower) | (raw > upper)
    weights = raw.clamp(max=upper) if bounds.lower is None else torch.where(outside, torch.zeros_like(raw), raw)
    per_token = level == "token"
    unit_mask = mask.bool() if per_token else mask.sum(-1) > 0  # statistics per token, or per sequence
    unit_raw = raw if per_token else raw[:, 0]
    unit_weights = weights if per_token else weights[:, 0]
    if batch_normalize:
        norm = masked_mean(unit_weights, unit_mask)
        weights = weights / torch.where(norm > 0, norm, torch.ones_like(norm))
        unit_weights = weights if per_token else weights[:, 0]
    mean = masked_mean(unit_weights, unit_mask)
    second = masked_mean(unit_weights.square(), unit_mask)
    metrics = {
        "rollout_is_mean": mean,
        "rollout_is_std": (second - mean.square()).clamp(min=0).sqrt(),
        "rollout_is_max": torch.where(unit_mask, unit_raw, -torch.inf).max(),
        "rollout_is_min": torch.where(unit_mask, unit_raw, torch.inf).min(),
        "rollout_is_ratio_fraction_high": masked_mean((unit_raw > upper).to(raw.dtype), unit_mask),
        "rollout_is_ratio_fraction_low": masked_mean((unit_raw < lower).to(raw.dtype), unit_mask),
        "rollout_is_eff_sample_size": mean.square() / torch.where(second > 0, second, torch.ones_like(second)),
    }
    if bounds.lower is not None:
        metrics["rollout_is_oob_ratio"] = masked_mean(outside.to(raw.dtype), mask.bool())
    return (weights * mask).detach(), metrics


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor,
                   bounds: dict[str, Bounds]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The response mask with rejected tokens set to 0 (every option must keep a token), and the masked
    fractions: of the valid tokens, and of the responses that lost at least one token."""
    valid = mask.bool()
    keep = valid.clone()
    dtype = log_ratio.dtype
    metrics = {}
    for option, bound in bounds.items():
        rule = ROLLOUT_RS.get(option)
        stat = rule.statistic(log_ratio.detach(), mask)
        if rule.ratio_bounds:
            kept = (stat >= math.log(bound.lower)) & (stat <= math.log(bound.upper))
        else:
            kept = stat <= bound.upper
        metrics[f"rollout_rs_{option}_masked_fraction"] = masked_mean((~kept).to(dtype), valid)
        keep &= kept
    responses = valid.any(-1)
    metrics["rollout_rs_masked_fraction"] = masked_mean((valid & ~keep).to(dtype), valid)
    metrics["rollout_rs_seq_masked_fraction"] = masked_mean((valid & ~keep).any(-1).to(dtype), responses)
    return keep.to(mask.dtype), metrics


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor,
                      mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """How far π_rollout is from π_old on the sampled tokens (veRL's off-policy diagnostics; docs/async.md says
    where the definitions differ). Per-response statistics average over responses with at least one token."""
    log_ratio = old_log_prob - rollout_log_prob
    bounded = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    responses = mask.sum(-1) > 0
    training_log_ppl = -masked_mean(old_log_prob, mask, dim=-1)
    rollout_log_ppl = -masked_mean(rollout_log_prob, mask, dim=-1)
    diff = training_log_ppl - rollout_log_ppl  # = mean log π_rollout − mean log π_old, per response
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "kl": masked_mean(rollout_log_prob - old_log_prob, mask),
        "k3_kl": masked_mean(torch.exp(bounded) - bounded - 1.0, mask),
        "training_log_ppl": masked_mean(training_log_ppl, responses),
        "rollout_log_ppl": masked_mean(rollout_log_ppl, responses),
        "training_ppl": masked_mean(torch.exp(training_log_ppl), responses),
        "rollout_ppl": masked_mean(torch.exp(rollout_log_ppl), responses),
        "log_ppl_diff": masked_mean(diff, responses),
        "log_ppl_abs_diff": masked_mean(diff.abs(), responses),
        "log_ppl_diff_max": _extreme(diff, responses, torch.amax),
        "log_ppl_diff_min": _extreme(diff, responses, torch.amin),
        "ppl_ratio": masked_mean(torch.exp(diff.clamp(-SAFETY_BOUND, SAFETY_BOUND)), responses),
        "chi2_token": masked_mean(torch.exp(2 * bounded), mask) - 1.0,
        "chi2_seq": masked_mean(torch.exp(2 * seq_log_ratio), responses) - 1.0,
    }


def _extreme(values: torch.Tensor, keep: torch.Tensor, reduce) -> torch.Tensor:
    """max or min of `values` where `keep` (0 when nothing is kept), without a host sync."""
    fill = -torch.inf if reduce is torch.amax else torch.inf
    out = reduce(torch.where(keep, values, torch.full_like(values, fill)))
    return torch.where(torch.isinf(out), torch.zeros_like(out), out)


@dataclass
class Correction:
    """What the actor update gets: IS weights (None when rollout_is is off) and the response mask with rejected
    tokens removed (None when rollout_rs is off); `metrics` are floats named rollout_corr/<name>."""

    weights: torch.Tensor | None
    mask: torch.Tensor | None
    metrics: dict[str, float]


def correction_tensors(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       cfg) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
    """(IS weights or None, rejection keep-mask or None, metrics as 0-dim tensors) under `cfg`
    (RolloutCorrectionConfig), without a host sync: bypass mode calls it in every micro-batch."""
    log_ratio = old_log_prob - rollout_log_prob
    metrics = offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask)
    weights = mask = None
    if cfg.rollout_is is not None:
        weights, is_metrics = is_weights(log_ratio, response_mask, cfg.rollout_is, cfg.rollout_is_threshold,
                                         cfg.rollout_is_batch_normalize)
        metrics.update(is_metrics)
    options = rs_options(cfg.rollout_rs)
    if options:
        mask, rs_metrics = rejection_mask(log_ratio, response_mask,
                                          parse_rs_thresholds(options, cfg.rollout_rs_threshold))
        metrics.update(rs_metrics)
    return weights, mask, metrics


def rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor,
                       cfg) -> Correction:
    """IS weights, rejection mask and metrics of one batch under `cfg` (RolloutCorrectionConfig)."""
    weights, mask, metrics = correction_tensors(old_log_prob, rollout_log_prob, response_mask, cfg)
    names = list(metrics)
    values = torch.stack([metrics[k].detach().double().reshape(()) for k in names]).cpu().tolist()
    return Correction(weights, mask, {f"rollout_corr/{k}": v for k, v in zip(names, values)})


def rollout_correction_problems(cfg) -> list[str]:
    """Config problems of algorithm.rollout_correction (names, thresholds, the log-probs it needs)."""
    rc = cfg.algorithm.rollout_correction
    problems = []
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS:
        try:
            ROLLOUT_IS.get(rc.rollout_is)
        except KeyError as e:
            problems.append(str(e))
    try:
        parse_is_threshold(rc.rollout_is_threshold)
    except ValueError as e:
        problems.append(str(e))
    options = rs_options(rc.rollout_rs)
    unknown = [o for o in options if o not in ROLLOUT_RS]
    for option in unknown:
        try:
            ROLLOUT_RS.get(option)
        except KeyError as e:
            problems.append(str(e))
    if options and not unknown:
        try:
            parse_rs_thresholds(options, rc.rollout_rs_threshold)
        except ValueError as e:
            problems.append(str(e))
    enabled = rc.rollout_is is not None or bool(options) or rc.bypass_mode
    if enabled and not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        problems.append(f"{KEY} needs the engine's log-probs of the sampled tokens; set "
                        "actor_rollout_ref.rollout.calculate_log_probs=true")
    return problems + _bypass_problems(cfg)


def _bypass_problems(cfg) -> list[str]:
    rc = cfg.algorithm.rollout_correction
    problems = []
    if rc.loss_type not in BYPASS_LOSS_TYPES:
        try:
            BYPASS_LOSS_TYPES.get(rc.loss_type)
        except KeyError as e:
            problems.append(str(e))
    return problems
