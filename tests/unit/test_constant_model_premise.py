"""The closed form the GPU engine tests rely on, checked with transformers on the CPU."""

from __future__ import annotations

import torch

from engine_fakes.constant_model import constant_model, expected_log_prob


def test_next_token_and_log_probs_are_known_in_closed_form():
    model = constant_model(7).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[3, 4, 5, 6], [9, 9, 2, 200]])).logits
    assert (logits.argmax(-1) == 7).all()
    for temperature in (0.5, 1.0, 2.0):
        log_probs = torch.log_softmax(logits / temperature, -1)
        # L = 0.25 / sqrt(1/256 + 1e-6) = 3.9995; log p(7) = L/T - log(e^(L/T) + 255);
        # T=1: 3.9995 - log(54.570 + 255) = -1.7357
        assert torch.allclose(log_probs[..., 7], torch.tensor(expected_log_prob(True, temperature)), atol=1e-4)
        assert torch.allclose(log_probs[..., 8], torch.tensor(expected_log_prob(False, temperature)), atol=1e-4)
    assert abs(expected_log_prob(True, 1.0) - (-1.7357)) < 1e-4
