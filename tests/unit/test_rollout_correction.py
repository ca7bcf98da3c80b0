"""Rollout correction against hand-computed numbers: IS weights per level, truncation, rejection masks, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from verlx.algorithms.core import agg_loss
from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.algorithms.rollout_correction import (
    ROLLOUT_IS,
    ROLLOUT_RS,
    is_weights,
    parse_rs_thresholds,
    rejection_mask,
    rollout_correction,
    rollout_correction_problems,
)
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig

# ratios pi_old / pi_rollout of two responses; the second has 2 valid tokens
RATIOS = torch.tensor([[0.5, 1.0, 3.0], [1.5, 4.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
ROLLOUT_LP = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -3.0, -1.0]], dtype=torch.float64)
OLD_LP = ROLLOUT_LP + torch.log(RATIOS)
LOG_RATIO = OLD_LP - ROLLOUT_LP


def close(a, b, tol=1e-12):
    return torch.allclose(torch.as_tensor(a, dtype=torch.float64), torch.as_tensor(b, dtype=torch.float64),
                          rtol=0, atol=tol)


def test_token_truncated_is_weights_and_statistics():
    weights, m = is_weights(LOG_RATIO, MASK, "token", threshold=2.0)
    assert close(weights, [[0.5, 1.0, 2.0], [1.5, 2.0, 0.0]])  # truncated at 2, zero at padding
    assert close(m["rollout_is_mean"], 7.0 / 5)
    assert close(m["rollout_is_max"], 4.0) and close(m["rollout_is_min"], 0.5)  # before truncation
    assert close(m["rollout_is_ratio_fraction_high"], 2 / 5)  # 3.0 and 4.0 were truncated
    _, low = is_weights(torch.log(torch.tensor([[0.4, 1.0, 0.3]], dtype=torch.float64)), torch.ones(1, 3), "token",
                        threshold=2.0)
    assert close(low["rollout_is_ratio_fraction_low"], 2 / 3)  # 0.4 and 0.3 are below 1/2
    mean_sq = (0.25 + 1 + 4 + 2.25 + 4) / 5
    assert close(m["rollout_is_std"], math.sqrt(mean_sq - 1.4**2))
    assert close(m["rollout_is_eff_sample_size"], 1.4**2 / mean_sq)
    assert not weights.requires_grad


def test_a_lower_upper_threshold_zeroes_weights_outside_the_interval_icepop():
    weights, m = is_weights(LOG_RATIO, MASK, "token", threshold="0.6_5")
    assert close(weights, [[0.0, 1.0, 3.0], [1.5, 4.0, 0.0]])  # 0.5 < 0.6 dropped; inside kept untruncated
    assert close(m["rollout_is_oob_ratio"], 1 / 5) and close(m["rollout_is_ratio_fraction_low"], 1 / 5)
    assert close(m["rollout_is_mean"], (1.0 + 3.0 + 1.5 + 4.0) / 5)
    narrow, n = is_weights(LOG_RATIO, MASK, "token", threshold="0.45_2.5")
    assert close(narrow, [[0.5, 1.0, 0.0], [1.5, 0.0, 0.0]])  # 3 and 4 above 2.5: dropped, not truncated
    assert close(n["rollout_is_oob_ratio"], 2 / 5) and close(n["rollout_is_ratio_fraction_high"], 2 / 5)
    seq, s = is_weights(LOG_RATIO, MASK, "sequence", threshold="0.5_2")
    assert close(seq, [[1.5, 1.5, 1.5], [0.0, 0.0, 0.0]])  # products 1.5 (kept) and 6 (outside)
    assert close(s["rollout_is_oob_ratio"], 2 / 5)  # per token: the second response's two tokens
    plain, p = is_weights(LOG_RATIO, MASK, "token", threshold="2.0")
    assert close(plain, [[0.5, 1.0, 2.0], [1.5, 2.0, 0.0]]) and "rollout_is_oob_ratio" not in p


def test_sequence_and_geometric_levels():
    seq, m = is_weights(LOG_RATIO, MASK, "sequence", threshold=2.0)
    assert close(seq, [[1.5, 1.5, 1.5], [2.0, 2.0, 0.0]])  # products 1.5 and 6 -> truncated to 2
    assert close(m["rollout_is_mean"], (1.5 + 2.0) / 2)  # one weight per sequence
    assert close(m["rollout_is_max"], 6.0) and close(m["rollout_is_ratio_fraction_high"], 0.5)
    geo, _ = is_weights(LOG_RATIO, MASK, "geometric", threshold=2.0)
    assert close(geo, [[1.5 ** (1 / 3)] * 3, [2.0, 2.0, 0.0]])  # sqrt(6) = 2.449 -> 2
    normalized, _ = is_weights(LOG_RATIO, MASK, "token", threshold=2.0, batch_normalize=True)
    assert close(normalized, torch.tensor([[0.5, 1.0, 2.0], [1.5, 2.0, 0.0]], dtype=torch.float64) / 1.4)


def test_rejection_masks_are_exact():
    keep, m = rejection_mask(LOG_RATIO, MASK, parse_rs_thresholds(["token_k1"], "0.6_2.5"))
    assert keep.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert close(m["rollout_rs_masked_fraction"], 3 / 5) and close(m["rollout_rs_seq_masked_fraction"], 1.0)
    # geometric means 1.5^(1/3) = 1.145 (kept) and sqrt(6) = 2.449 (rejected): whole responses
    keep, m = rejection_mask(LOG_RATIO, MASK, parse_rs_thresholds(["seq_mean_k1"], "0.8_1.25"))
    assert keep.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert close(m["rollout_rs_masked_fraction"], 2 / 5) and close(m["rollout_rs_seq_masked_fraction"], 0.5)
    # k2 = (log r)^2 / 2: 0.240, 0, 0.603, 0.082, 0.961 against 0.5
    keep, m = rejection_mask(LOG_RATIO, MASK, parse_rs_thresholds(["token_k2"], 0.5))
    assert keep.tolist() == [[1, 1, 0], [1, 0, 0]]
    # two options: a token must pass both; each option's own fraction is reported
    both = parse_rs_thresholds(["token_k2", "seq_sum_k1"], "0.5,0.5_2.0")  # products 1.5 (kept) and 6 (not)
    keep, m = rejection_mask(LOG_RATIO, MASK, both)
    assert keep.tolist() == [[1, 1, 0], [0, 0, 0]]
    assert close(m["rollout_rs_token_k2_masked_fraction"], 2 / 5)
    assert close(m["rollout_rs_seq_sum_k1_masked_fraction"], 2 / 5)
    assert close(m["rollout_rs_masked_fraction"], 3 / 5)


def test_one_k1_bound_means_a_symmetric_ratio_interval():
    assert parse_rs_thresholds(["token_k1"], 2.0)["token_k1"].lower == 0.5
    assert parse_rs_thresholds(["token_k1"], "2.0")["token_k1"].upper == 2.0
    with pytest.raises(ValueError, match="takes one upper bound"):
        parse_rs_thresholds(["token_k3"], "0.5_2")
    with pytest.raises(ValueError, match="2 entries for 3"):
        parse_rs_thresholds(["token_k1", "token_k2", "token_k3"], "2,3")
    with pytest.raises(ValueError, match="positive"):
        parse_rs_thresholds(["token_k2"], -1.0)


def test_offpolicy_metrics_and_the_batch_entry_point():
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.6_2.5"]))).algorithm.rollout_correction
    out = rollout_correction(OLD_LP, ROLLOUT_LP, MASK, cfg)
    m = out.metrics
    assert close(m["rollout_corr/kl"], -math.log(0.5 * 3.0 * 1.5 * 4.0) / 5)
    assert close(m["rollout_corr/chi2_token"], (0.25 + 1 + 9 + 2.25 + 16) / 5 - 1)
    k3 = sum(r - 1 - math.log(r) for r in (0.5, 1.0, 3.0, 1.5, 4.0)) / 5
    assert close(m["rollout_corr/k3_kl"], k3)
    # per response: mean log pi_rollout - mean log pi_old = -mean log r (veRL's sign): -ln(1.5)/3 and -ln(6)/2
    diffs = [-math.log(1.5) / 3, -math.log(6.0) / 2]
    assert close(m["rollout_corr/log_ppl_diff"], sum(diffs) / 2)
    assert close(m["rollout_corr/log_ppl_diff_max"], diffs[0]) and close(m["rollout_corr/log_ppl_diff_min"], diffs[1])
    assert close(m["rollout_corr/log_ppl_abs_diff"], -sum(diffs) / 2)
    assert close(m["rollout_corr/ppl_ratio"], (1.5 ** (-1 / 3) + 6 ** -0.5) / 2)  # training ppl / rollout ppl
    assert close(m["rollout_corr/training_log_ppl"] - m["rollout_corr/rollout_log_ppl"], sum(diffs) / 2)
    assert close(m["rollout_corr/chi2_seq"], (1.5 ** 2 + 6.0 ** 2) / 2 - 1)  # products of the ratios, squared
    assert close(m["rollout_corr/rollout_is_mean"], 1.4) and close(m["rollout_corr/rollout_rs_masked_fraction"], 0.6)
    assert out.mask.tolist() == [[0, 1, 0], [1, 0, 0]]
    assert close(out.weights, [[0.5, 1.0, 2.0], [1.5, 2.0, 0.0]])
    off = rollout_correction(OLD_LP, ROLLOUT_LP, MASK, type(cfg)())  # correction off: diagnostics only
    assert off.weights is None and off.mask is None and "rollout_corr/kl" in off.metrics
    assert not any("rollout_is" in k for k in off.metrics)


def test_weights_multiply_each_token_loss_and_none_changes_nothing():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = MASK.float()
    w = torch.tensor([[0.5, 1.0, 2.0], [1.5, 2.0, 9.0]])
    assert agg_loss(loss, mask, "token-mean", weights=w).item() == pytest.approx((0.5 + 2 + 6 + 6 + 10) / 5)
    assert torch.equal(agg_loss(loss, mask, "token-mean", weights=None), agg_loss(loss, mask, "token-mean"))
    cfg = build(PPOConfig, {}).actor_rollout_ref.actor
    old = torch.zeros(2, 3)
    new = torch.tensor([[0.1, -0.1, 0.0], [0.05, 0.0, 0.0]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, 1.0], [2.0, 2.0, 2.0]])
    weighted, _ = POLICY_LOSSES.get("vanilla")(old, new, adv, mask, "token-mean", cfg, weights=w)
    per_token = torch.maximum(-adv * torch.exp(new), -adv * torch.clamp(torch.exp(new), 0.8, 1.2))
    assert weighted.item() == pytest.approx(((per_token * w * mask).sum() / mask.sum()).item(), abs=1e-7)


def test_registries_list_veRL_option_names():
    assert ROLLOUT_IS.names() == ["geometric", "sequence", "token"]
    assert set(ROLLOUT_RS.names()) == {"token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                                       "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"}


@pytest.mark.parametrize("overrides,message", [
    (["algorithm.rollout_correction.rollout_is_threshold=0"], "rollout_is_threshold=0.0 must be a positive"),
    (["algorithm.rollout_correction.rollout_is_threshold=-1.5"], "rollout_is_threshold=-1.5 must be a positive"),
    (["algorithm.rollout_correction.rollout_is_threshold=4.0_0.5"], "'lower_upper' with 0 < lower <= upper"),
    (["algorithm.rollout_correction.rollout_is_threshold=0.5_x"], "nor 'lower_upper' (IcePop"),
    (["algorithm.rollout_correction.rollout_is=tokn"], "Did you mean 'token'?"),
    (["algorithm.rollout_correction.rollout_rs=token_k4", "algorithm.rollout_correction.rollout_rs_threshold=2"],
     "unknown rollout rejection option 'token_k4'"),
    (["algorithm.rollout_correction.rollout_rs=token_k1"], "rollout_rs_threshold is null"),
    (["algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=false"],
     "calculate_log_probs=true"),
])
def test_bad_rollout_correction_config_is_named(overrides, message):
    cfg = build(PPOConfig, to_container(load_yaml(overrides=overrides)))
    problems = rollout_correction_problems(cfg)
    assert any(message in p for p in problems), problems


def test_an_icepop_threshold_from_the_command_line_is_accepted():
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[
        "algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0.5_4.0",
        "actor_rollout_ref.rollout.calculate_log_probs=true"])))
    assert cfg.algorithm.rollout_correction.rollout_is_threshold == "0.5_4.0"
    assert rollout_correction_problems(cfg) == []
