"""KL estimators, the exact KL from logits, the controllers and the in-reward penalty."""

from __future__ import annotations

import math

import pytest
import torch

from verlx.algorithms.kl import (
    KL_CONTROLLERS,
    KL_PENALTIES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    full_kl_from_logits,
    kl_needs_full_distribution,
    kl_penalty,
    make_kl_controller,
)
from verlx.config.run import KLControlConfig
from verlx.protocol import DataProto

# log r = log pi - log pi_ref = 0.5 and -1.0
LOGP = torch.tensor([[-1.0, -2.0]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0]], dtype=torch.float64)


@pytest.mark.parametrize(
    "names,expected",
    [
        (("kl", "k1"), [0.5, -1.0]),  # log r
        (("abs",), [0.5, 1.0]),  # |log r|
        (("mse", "k2"), [0.125, 0.5]),  # 0.5 (log r)^2
        # exp(ref - logp) - (ref - logp) - 1: e^-0.5 + 0.5 - 1 = 0.1065307, e^1 - 1 - 1 = 0.7182818
        (("low_var_kl", "k3"), [0.1065307, 0.7182818]),
    ],
)
def test_estimators_and_aliases(names, expected):
    for name in names:
        assert kl_penalty(LOGP, REF, name)[0].tolist() == pytest.approx(expected, abs=1e-7)


def test_low_var_kl_is_clamped_to_ten():
    # ref - logp = 20: e^20 - 21 is far above 10; 30 is first clamped to 20, then the result to 10
    out = kl_penalty(torch.tensor([0.0, 0.0]), torch.tensor([20.0, 30.0]), "low_var_kl")
    assert out.tolist() == [10.0, 10.0]


def test_low_var_kl_gradient():
    logp = torch.tensor([-1.0, -2.0, 0.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.5, -1.0, 20.0], dtype=torch.float64)
    kl_penalty(logp, ref, "k3").sum().backward()
    # d/dlogp [exp(ref - logp) - (ref - logp) - 1] = 1 - exp(ref - logp): 1 - e^-0.5 = 0.3934693, 1 - e = -1.7182818;
    # the third token is clamped at 10: gradient 0
    assert logp.grad.tolist() == pytest.approx([0.3934693, -1.7182818, 0.0], abs=1e-7)


@pytest.mark.parametrize(
    "names,value",
    [
        (("kl+", "k1+"), [0.5, -1.0]),
        (("abs+",), [0.5, 1.0]),
        (("low_var_kl+", "k3+"), [0.1065307, 0.7182818]),
        (("mse+", "k2+"), [0.125, 0.5]),
    ],
)
def test_straight_through_variants_keep_the_value_and_take_the_k2_gradient(names, value):
    for name in names:
        logp = LOGP.clone().requires_grad_(True)
        out = kl_penalty(logp, REF, name)
        out.sum().backward()
        assert out[0].tolist() == pytest.approx(value, abs=1e-7)
        # d/dlogp of k2 = 0.5 (logp - ref)^2 is logp - ref = 0.5, -1.0 (k1's would be 1, 1; k3's 0.3934693, -1.7182818)
        assert logp.grad[0].tolist() == pytest.approx([0.5, -1.0])


def test_straight_through_in_the_reward_changes_nothing():
    scores = torch.zeros(1, 2)
    data = DataProto({"token_level_scores": scores, "old_log_probs": LOGP.float(), "ref_log_prob": REF.float(),
                      "response_mask": torch.ones(1, 2)})
    plain, _ = apply_kl_penalty(data, FixedKLController(0.1), "k3")
    expected = plain.batch["token_level_rewards"].clone()
    through, _ = apply_kl_penalty(data, FixedKLController(0.1), "k3+")
    assert torch.equal(through.batch["token_level_rewards"], expected)


def test_full_kl_from_logits():
    # p = softmax(0, 0) = (0.5, 0.5), q = softmax(ln 3, 0) = (0.75, 0.25)
    # KL = 0.5 ln(0.5/0.75) + 0.5 ln(0.5/0.25) = 0.5 ln(4/3) = 0.1438410
    logits = torch.tensor([[0.0, 0.0], [1000.0, 1000.0], [2.0, -1.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[math.log(3), 0.0], [1000.0 + math.log(3), 1000.0], [2.0, -1.0]], dtype=torch.float64)
    kl = full_kl_from_logits(logits, ref)
    assert kl.tolist() == pytest.approx([0.1438410, 0.1438410, 0.0], abs=1e-6)
    kl[0].backward()
    # dKL/dz_j = p_j (log p_j - log q_j - KL): 0.5 (ln(2/3) - 0.143841) = -0.2746531, 0.5 (ln 2 - 0.143841) = 0.2746531
    assert logits.grad[0].tolist() == pytest.approx([-0.2746531, 0.2746531], abs=1e-6)


def test_full_kl_of_bfloat16_logits_is_reduced_in_float32():
    logits = torch.tensor([[0.0, 0.0]], dtype=torch.bfloat16)
    ref = torch.tensor([[1.0986123, 0.0]], dtype=torch.bfloat16)  # ln 3 rounds to 1 + 13/128 = 1.1015625
    kl = full_kl_from_logits(logits, ref)
    # q = softmax(1.1015625, 0) = (0.750553, 0.249447): 0.5 ln(0.5/0.750553) + 0.5 ln(0.5/0.249447) = 0.144579
    assert kl.dtype == torch.float32 and kl.item() == pytest.approx(0.144579, abs=1e-6)


def test_full_kl_ignores_vocabulary_entries_both_models_mask():
    logits = torch.tensor([[0.0, -math.inf, 0.0]])
    ref = torch.tensor([[math.log(3), -math.inf, 0.0]])
    assert full_kl_from_logits(logits, ref).tolist() == pytest.approx([0.1438410], abs=1e-6)


def test_full_penalty_needs_the_full_kl():
    assert kl_needs_full_distribution("full") and not kl_needs_full_distribution("k3")
    with pytest.raises(ValueError, match="full_kl_from_logits"):
        kl_penalty(LOGP, REF, "full")
    given = torch.tensor([[0.25, 0.5]], dtype=torch.float64)
    assert kl_penalty(LOGP, REF, "full", full_kl=given) is given
    with pytest.raises(ValueError, match=r"full_kl has shape \(2,\), expected \(1, 2\)"):
        kl_penalty(LOGP, REF, "full", full_kl=torch.zeros(2))


def test_unknown_kl_penalty_lists_the_registered_ones():
    with pytest.raises(KeyError) as err:
        kl_penalty(LOGP, REF, "low_var")
    assert "abs, abs+, full, k1, k1+, k2, k2+, k3, k3+, kl, kl+, low_var_kl, low_var_kl+, mse, mse+" in str(err.value)
    assert set(KL_PENALTIES) == {"abs", "full", "k1", "k2", "k3", "kl", "low_var_kl", "mse", "abs+", "k1+", "k2+",
                                 "k3+", "kl+", "low_var_kl+", "mse+"}


def test_controllers():
    fixed = make_kl_controller(KLControlConfig(type="fixed", kl_coef=0.3))
    fixed.update(current_kl=5.0, n_steps=100)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.3
    adaptive = make_kl_controller(KLControlConfig(type="adaptive", kl_coef=0.1, target_kl=0.1, horizon=100))
    assert isinstance(adaptive, AdaptiveKLController)
    adaptive.update(current_kl=0.15, n_steps=10)  # error clip(0.15/0.1 - 1, ±0.2) = 0.2 -> x (1 + 0.2*10/100) = 1.02
    assert adaptive.value == pytest.approx(0.102)
    adaptive.update(current_kl=0.09, n_steps=10)  # error -0.1 -> x 0.99
    assert adaptive.value == pytest.approx(0.10098)


def test_controller_config_errors():
    with pytest.raises(KeyError, match="algorithm.kl_ctrl.type.*adaptive, fixed"):
        make_kl_controller(KLControlConfig(type="pid"))
    with pytest.raises(ValueError, match="algorithm.kl_ctrl.horizon=0 must be > 0"):
        make_kl_controller(KLControlConfig(type="adaptive", horizon=0))
    assert list(KL_CONTROLLERS) == ["adaptive", "fixed"]


def kl_batch():
    # log r per token: row 0: 0.5, -0.2, 0.3, (masked 9); row 1: 0.1, 0.1, (masked 7, 7)
    log_ratio = torch.tensor([[0.5, -0.2, 0.3, 9.0], [0.1, 0.1, 7.0, 7.0]])
    ref = torch.full((2, 4), -2.0)
    return DataProto({
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]]),
        "response_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]),
        "old_log_probs": ref + log_ratio,
        "ref_log_prob": ref,
    })


def test_apply_kl_penalty_with_a_fixed_coefficient():
    data, metrics = apply_kl_penalty(kl_batch(), FixedKLController(0.1), kl_penalty="kl")
    # rewards = scores - 0.1 * KL on response tokens: row 0: -0.05, 0.02, 1 - 0.03; row 1: -0.01, 2 - 0.01
    expected = torch.tensor([[-0.05, 0.02, 0.97, 0.0], [-0.01, 1.99, 0.0, 0.0]])
    torch.testing.assert_close(data.batch["token_level_rewards"], expected)
    # batch KL: mean over samples of the token mean: (0.6/3 + 0.2/2) / 2 = 0.15
    assert metrics == pytest.approx({"actor/reward_kl_penalty": 0.15, "actor/reward_kl_penalty_coeff": 0.1})


def test_apply_kl_penalty_updates_an_adaptive_controller_with_the_batch_size():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    _, metrics = apply_kl_penalty(kl_batch(), ctrl, kl_penalty="kl")
    assert metrics["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)  # the coefficient that was applied
    assert ctrl.value == pytest.approx(0.1004)  # error clip(0.15/0.1 - 1) = 0.2, n_steps = 2 -> x 1.004


def test_apply_kl_penalty_full_reads_full_kl_from_the_batch():
    data = kl_batch()
    with pytest.raises(ValueError, match="full_kl_from_logits"):
        apply_kl_penalty(data, FixedKLController(0.1), kl_penalty="full")
    data.batch["full_kl"] = torch.tensor([[1.0, 1.0, 1.0, 50.0], [2.0, 2.0, 50.0, 50.0]])
    data, metrics = apply_kl_penalty(data, FixedKLController(0.5), kl_penalty="full")
    # rewards: scores - 0.5 * full_kl on response tokens; batch KL (1 + 2) / 2 = 1.5
    expected = torch.tensor([[-0.5, -0.5, 0.5, 0.0], [-1.0, 1.0, 0.0, 0.0]])
    torch.testing.assert_close(data.batch["token_level_rewards"], expected)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(1.5)
