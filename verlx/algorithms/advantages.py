"""Advantage estimators (algorithm.adv_estimator), registered by name with what each one needs from the trainer.

Every estimator maps token-level rewards [B, R] and the response mask [B, R] (plus, depending on the estimator,
critic values [B, R], the per-row group label `index`, greedy-response baselines [B], the reward function's
component columns, or old log-probs and sum_v pi_v^2 per token) to (advantages, returns), both [B, R] and 0 outside
the mask. Definitions follow veRL 0.9.1's core_algos; where they differ it is said below. The optimal token
baseline estimators live in algorithms/token_baseline.py.

Group estimators compare the samples of one prompt (rows sharing a uid). A group of one sample has nothing to
compare with, so its advantage is 0 (veRL gives the raw score in grpo/opo/gpg and raises in grpo_passk).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from verlx.algorithms.core import masked_whiten
from verlx.algorithms.groups import group_best_and_runner_up, group_ids, group_stats, group_weighted_mean
from verlx.algorithms.returns import discounted_reverse_cumsum, pack_valid_left, unpack
from verlx.utils.registry import Registry

if TYPE_CHECKING:
    from verlx.config.schema import PPOConfig

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class AdvantageEstimator:
    """An estimator function and what the trainer must provide for it."""

    name: str
    fn: AdvantageFn
    needs_critic: bool = False
    needs_groups: bool = False
    needs_greedy_baseline: bool = False
    needs_sum_pi_squared: bool = False  # the actor's old-log-prob pass must also return sum_v pi_v^2 per token

    @cached_property
    def parameters(self) -> dict[str, inspect.Parameter]:
        return dict(inspect.signature(self.fn).parameters)

    def __call__(self, **inputs) -> tuple[torch.Tensor, torch.Tensor]:
        """Call fn with the inputs it takes; the others are ignored."""
        return self.fn(**{k: v for k, v in inputs.items() if k in self.parameters})


ADV_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", "algorithm.adv_estimator")
ADV_ESTIMATORS.register_lazy("optimal_token_baseline", "verlx.algorithms.token_baseline:OPTIMAL_TOKEN_BASELINE")
ADV_ESTIMATORS.register_lazy("tir_optimal_token_baseline",
                             "verlx.algorithms.token_baseline:TIR_OPTIMAL_TOKEN_BASELINE")


def register_estimator(name: str, *, needs_critic=False, needs_groups=False, needs_greedy_baseline=False):
    def decorator(fn: AdvantageFn) -> AdvantageFn:
        ADV_ESTIMATORS.register(name)(AdvantageEstimator(name, torch.no_grad()(fn), needs_critic, needs_groups,
                                                         needs_greedy_baseline))
        return fn

    return decorator


def estimator_needs_critic(name: str) -> bool:
    return ADV_ESTIMATORS.get(name).needs_critic


def uses_critic(config: PPOConfig) -> bool:
    """critic.enable when set, else whether algorithm.adv_estimator needs values (KeyError for an unknown one)."""
    if config.critic.enable is not None:
        return config.critic.enable
    return estimator_needs_critic(config.algorithm.adv_estimator)


def estimator_needs_groups(name: str) -> bool:
    return ADV_ESTIMATORS.get(name).needs_groups


def estimator_needs_greedy_baseline(name: str) -> bool:
    return ADV_ESTIMATORS.get(name).needs_greedy_baseline


def needs_sum_pi_squared(config: PPOConfig) -> bool:
    """Whether the old-log-prob pass returns sum_v pi_v^2: actor.calculate_sum_pi_squared, or an estimator that
    reads it (KeyError for an unknown one)."""
    return (config.actor_rollout_ref.actor.calculate_sum_pi_squared
            or ADV_ESTIMATORS.get(config.algorithm.adv_estimator).needs_sum_pi_squared)


def _outcome(advantage_per_sample: torch.Tensor, response_mask: torch.Tensor):
    """One scalar per sample, spread over its response tokens; it is both the advantage and the return."""
    adv = advantage_per_sample[:, None] * response_mask.to(advantage_per_sample.dtype)
    return adv, adv


def _groups(scores: torch.Tensor, index):
    ids, num_groups = group_ids(index, scores.device)
    if ids.shape[0] != scores.shape[0]:
        raise ValueError(f"group index has {ids.shape[0]} entries for {scores.shape[0]} samples")
    return ids, num_groups


@register_estimator("gae", needs_critic=True)
def gae(token_level_rewards, response_mask, values, gamma: float = 1.0, lam: float = 1.0):
    """GAE (Schulman et al. 2015): delta_t = r_t + gamma V_{t+1} - V_t, A_t = sum_k (gamma lam)^k delta_{t+k},
    returns = A + V, then A whitened over the batch's response tokens. Tokens outside the mask are skipped: t+1
    means the next token inside the mask."""
    dtype = token_level_rewards.dtype
    order = pack_valid_left(response_mask)
    mask = response_mask.gather(-1, order).to(dtype)
    rewards = token_level_rewards.gather(-1, order) * mask
    vals = values.gather(-1, order).to(dtype) * mask
    next_vals = torch.nn.functional.pad(vals[:, 1:], (0, 1))
    deltas = (rewards + gamma * next_vals - vals) * mask
    adv = discounted_reverse_cumsum(deltas, gamma * lam) * mask
    returns = unpack((adv + vals) * mask, order)
    adv = unpack(adv, order)
    valid = response_mask.to(dtype)
    return masked_whiten(adv, valid) * valid, returns


@register_estimator("grpo", needs_groups=True)
def grpo(token_level_rewards, response_mask, index, epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True):
    """GRPO (Shao et al. 2024): A_i = (s_i - mean_g) / (std_g + eps), or s_i - mean_g without std normalisation
    (Dr.GRPO, Liu et al. 2025). s_i is the sum of sample i's token rewards; std is the unbiased group std."""
    scores = token_level_rewards.sum(dim=-1)
    stats = group_stats(scores, *_groups(scores, index))
    adv = scores - stats.mean
    if norm_adv_by_std_in_grpo:
        adv = adv / (stats.std + epsilon)
    return _outcome(torch.where(stats.singleton, torch.zeros_like(adv), adv), response_mask)


@register_estimator("grpo_passk", needs_groups=True)
def grpo_passk(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
               norm_adv_by_std_in_grpo: bool = True):
    """Pass@k GRPO (Tang et al. 2025): only the group's best sample (the first among ties) gets an advantage,
    s_max - s_second, divided by (std_g + eps) when normalising; every other sample gets 0."""
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = _groups(scores, index)
    stats = group_stats(scores, ids, num_groups)
    is_best, best, runner_up = group_best_and_runner_up(scores, ids, num_groups)
    adv = best - runner_up
    if norm_adv_by_std_in_grpo:
        adv = adv / (stats.std + epsilon)
    return _outcome(torch.where(is_best & ~stats.singleton, adv, torch.zeros_like(adv)), response_mask)


@register_estimator("gdpo", needs_groups=True)
def gdpo(response_mask, index, reward_components, gdpo_reward_weights=None, epsilon: float = 1e-6,
         norm_adv_by_std_in_grpo: bool = True):
    """GDPO (arXiv 2601.05242): every reward component k (a column the reward function returns, named in
    algorithm.gdpo_reward_keys) is GRPO-normalised within its group on its own, a_k = (s_k - mean_g) / (std_g + eps),
    so that a large component cannot drown a small one; A = sum_k w_k a_k (gdpo_reward_weights, default 1) is then
    whitened over the batch's response tokens. token_level_rewards are not read (nor, therefore, a KL-in-reward
    penalty), as in veRL."""
    names = list(reward_components)
    weights = gdpo_reward_weights if gdpo_reward_weights is not None else [1.0] * len(names)
    total = torch.zeros(response_mask.shape[0], dtype=torch.float32, device=response_mask.device)
    ids, num_groups = _groups(total, index)
    for name, weight in zip(names, weights):  # a handful of components
        scores = reward_components[name].to(total)
        stats = group_stats(scores, ids, num_groups)
        normalised = scores - stats.mean
        if norm_adv_by_std_in_grpo:
            normalised = normalised / (stats.std + epsilon)
        total = total + weight * torch.where(stats.singleton, torch.zeros_like(normalised), normalised)
    valid = response_mask.to(total.dtype)
    adv = masked_whiten(total[:, None] * valid, valid) * valid
    return adv, adv


@register_estimator("rloo", needs_groups=True)
def rloo(token_level_rewards, response_mask, index):
    """RLOO (Ahmadian et al. 2024): A_i = s_i - mean of the other samples = n/(n-1) * (s_i - mean_g)."""
    scores = token_level_rewards.sum(dim=-1)
    stats = group_stats(scores, *_groups(scores, index))
    adv = (scores - stats.mean) * stats.count / (stats.count - 1).clamp(min=1)
    return _outcome(torch.where(stats.singleton, torch.zeros_like(adv), adv), response_mask)


@register_estimator("opo", needs_groups=True)
def opo(token_level_rewards, response_mask, index):
    """OPO (Hao et al. 2025): the baseline is the length-weighted group mean, A_i = s_i - sum(l_j s_j) / sum(l_j)
    with l_j the number of response tokens of sample j."""
    scores = token_level_rewards.sum(dim=-1)
    ids, num_groups = _groups(scores, index)
    stats = group_stats(scores, ids, num_groups)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)
    adv = scores - group_weighted_mean(scores, lengths, ids, num_groups)
    return _outcome(torch.where(stats.singleton, torch.zeros_like(adv), adv), response_mask)


@register_estimator("gpg", needs_groups=True)
def gpg(token_level_rewards, response_mask, index):
    """GPG (Chu et al. 2025): A_i = alpha * (s_i - mean_g) with alpha = B / #(samples with s_i != 0), which
    scales up the gradient when many samples carry no reward (veRL's choice of counting non-zero scores)."""
    scores = token_level_rewards.sum(dim=-1)
    stats = group_stats(scores, *_groups(scores, index))
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    adv = alpha * (scores - stats.mean)
    return _outcome(torch.where(stats.singleton, torch.zeros_like(adv), adv), response_mask)


def _discounted_returns(token_level_rewards, response_mask, gamma: float) -> torch.Tensor:
    """G_t = sum_k gamma^k r_{t+k} over the tokens inside the mask (tokens outside it are skipped), 0 outside."""
    order = pack_valid_left(response_mask)
    mask = response_mask.gather(-1, order).to(token_level_rewards.dtype)
    packed = discounted_reverse_cumsum(token_level_rewards.gather(-1, order) * mask, gamma) * mask
    return unpack(packed, order)


@register_estimator("reinforce_plus_plus")
def reinforce_plus_plus(token_level_rewards, response_mask, gamma: float = 1.0):
    """REINFORCE++ (Hu 2025): discounted returns G_t, advantages = G whitened over the batch's response tokens.
    Tokens outside the mask (tool output in multi-turn) are skipped: the return flows past them to earlier turns
    and their own rewards are not counted, as in veRL 0.9.1 (which carries the running return through them)."""
    valid = response_mask.to(token_level_rewards.dtype)
    returns = _discounted_returns(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, valid) * valid, returns


@register_estimator("reinforce_plus_plus_baseline", needs_groups=True)
def reinforce_plus_plus_baseline(token_level_rewards, response_mask, index):
    """REINFORCE++ with baseline (Hu 2025): s_i - mean_g on every response token, whitened over the batch."""
    scores = token_level_rewards.sum(dim=-1)
    stats = group_stats(scores, *_groups(scores, index))
    centered = torch.where(stats.singleton, torch.zeros_like(scores), scores - stats.mean)
    valid = response_mask.to(scores.dtype)
    adv = masked_whiten(centered[:, None] * valid, valid) * valid
    return adv, adv


@register_estimator("remax", needs_greedy_baseline=True)
def remax(token_level_rewards, response_mask, reward_baselines):
    """ReMax (Li et al. 2023): returns G_t = sum_{k >= t} r_k (undiscounted), A_t = G_t - b with b the reward of
    the greedy response to the same prompt (the trainer generates it)."""
    valid = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * valid).flip(-1).cumsum(-1).flip(-1) * valid
    return returns - reward_baselines.to(returns.dtype)[:, None] * valid, returns


def compute_advantage(data, config):
    """Write batch['advantages'] and batch['returns'] for the configured estimator (AlgorithmConfig); returns data.

    Reads batch keys token_level_rewards, response_mask, values (critic estimators), reward_baselines (remax),
    old_log_probs, sum_pi_squared and rollout_is_weights (optimal token baseline; the weights only when rollout IS
    is on), non_tensor_batch['uid'] (group estimators) and the columns algorithm.gdpo_reward_keys names (gdpo).
    """
    estimator = ADV_ESTIMATORS.get(config.adv_estimator)
    inputs = {
        "gamma": config.gamma,
        "lam": config.lam,
        "norm_adv_by_std_in_grpo": config.norm_adv_by_std_in_grpo,
        "gdpo_reward_weights": config.gdpo_reward_weights,
    }
    sources = _sources(data)
    for name, parameter in estimator.parameters.items():
        if name == "reward_components":
            inputs[name] = _reward_components(data, config)
            continue
        if name not in sources:
            continue
        what, value = sources[name]
        if value is None and parameter.default is inspect.Parameter.empty:
            raise ValueError(f"algorithm.adv_estimator={estimator.name} needs {what}, which the batch does not have; "
                             f"present: {sorted(data.keys())}")
        inputs[name] = value
    advantages, returns = estimator(**inputs)
    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def _sources(data) -> dict[str, tuple[str, object]]:
    """Estimator parameter -> (what it is, for errors; its value in the batch or None)."""
    batch = data.batch
    return {
        "token_level_rewards": ("batch key 'token_level_rewards'", batch.get("token_level_rewards")),
        "response_mask": ("batch key 'response_mask'", batch.get("response_mask")),
        "values": ("batch key 'values' (critic values; the critic must run before advantages)", batch.get("values")),
        "reward_baselines": ("batch key 'reward_baselines' (reward of the greedy response per prompt)",
                             batch.get("reward_baselines")),
        "index": ("non_tensor_batch key 'uid' (one id per prompt, shared by its n samples)",
                  data.non_tensor_batch.get("uid")),
        "old_log_probs": ("batch key 'old_log_probs'", batch.get("old_log_probs")),
        "sum_pi_squared": ("batch key 'sum_pi_squared' (from the actor's old-log-prob pass)",
                           batch.get("sum_pi_squared")),
        "rollout_is_weights": ("batch key 'rollout_is_weights'", batch.get("rollout_is_weights")),
    }


def _reward_components(data, config) -> dict[str, torch.Tensor]:
    """{key: [B] float tensor} of the non-tensor columns algorithm.gdpo_reward_keys names."""
    keys = config.gdpo_reward_keys or []
    if not keys:
        raise ValueError(f"algorithm.adv_estimator={config.adv_estimator} needs algorithm.gdpo_reward_keys: the "
                         "reward components your reward function returns, e.g. [format_reward,accuracy_reward]")
    device = data.batch["response_mask"].device
    columns = {}
    for key in keys:
        if key not in data.non_tensor_batch:
            raise ValueError(f"algorithm.gdpo_reward_keys names '{key}', which the reward function did not return; "
                             f"its columns: {sorted(data.non_tensor_batch)}. Return a dict with a '{key}' entry from "
                             "compute_score")
        try:
            columns[key] = torch.as_tensor(np.asarray(data.non_tensor_batch[key], dtype=np.float32), device=device)
        except (TypeError, ValueError):
            raise ValueError(f"algorithm.gdpo_reward_keys: column '{key}' is not numeric") from None
    return columns


def estimator_problems(config: PPOConfig) -> list[str]:
    """Config problems of the chosen estimator's own keys (names are checked elsewhere)."""
    a = config.algorithm
    problems = []
    try:
        estimator = ADV_ESTIMATORS.get(a.adv_estimator)
    except KeyError:
        return problems
    if "reward_components" in estimator.parameters:
        if not a.gdpo_reward_keys:
            problems.append(f"algorithm.adv_estimator={a.adv_estimator} needs algorithm.gdpo_reward_keys: the reward "
                            "components your reward function returns, e.g. [format_reward,accuracy_reward]")
        elif a.gdpo_reward_weights is not None and len(a.gdpo_reward_weights) != len(a.gdpo_reward_keys):
            problems.append(f"algorithm.gdpo_reward_weights has {len(a.gdpo_reward_weights)} entries for "
                            f"{len(a.gdpo_reward_keys)} algorithm.gdpo_reward_keys; give one weight per key or null")
    if estimator.needs_sum_pi_squared and a.rollout_correction.bypass_mode:
        problems.append(f"algorithm.adv_estimator={a.adv_estimator} needs sum_v pi_v^2 from the old-log-prob pass, "
                        "which algorithm.rollout_correction.bypass_mode=true skips; turn one of them off")
    return problems
