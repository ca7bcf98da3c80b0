"""MetricAccumulator keeps every value on its own device and reduces to exact means.

On 2 × H100 the megatron PP=2 update failed in reduce_metrics: the losses were CUDA tensors, the gradient norm
(megatron's optimizer returns a Python float) a CPU tensor, and one torch.stack over both raised "Expected all
tensors to be on the same device". The CPU has no second real device; the meta device has the same rule, so an
accumulator on "meta" fed CPU tensors and floats reproduces that shape here.
"""

from __future__ import annotations

import pytest
import torch

from verlx.metrics.accumulator import MetricAccumulator


def test_values_from_other_devices_are_stacked_on_the_accumulators_device():
    metrics = MetricAccumulator(torch.device("meta"))
    metrics.add_sum("actor/pg_loss", torch.ones((), device="meta"))  # the loss, on the compute device
    metrics.add_mean("actor/grad_norm", 2.5)  # megatron's optimizer.step() returns a float
    metrics.add_mean("actor/other", torch.tensor([3.0]))  # a CPU tensor of shape [1]
    names, values = metrics.local_means()
    assert names == ["actor/grad_norm", "actor/other", "actor/pg_loss"]
    assert values.device.type == "meta" and values.dtype == torch.float64 and values.shape == (3,)


def test_means_over_steps_counts_and_constants_without_a_process_group():
    metrics = MetricAccumulator(torch.device("cpu"))
    for step, (a, b, norm) in enumerate([(1.0, 2.0, 4.0), (3.0, 5.0, 6.0)]):
        metrics.add_sum("loss", torch.tensor(a))  # two micro-batches per step: summed within the step
        metrics.add_sum("loss", torch.tensor(b))
        metrics.add_mean("grad_norm", norm)
        if step == 1:
            metrics.add_count("skipped")
        metrics.end_step()
    metrics.set("kl_coef", 0.001)
    out = metrics.reduce()
    # loss: steps sum to 3 and 8, mean 5.5; grad_norm: mean of 4 and 6
    assert out == {"loss": 5.5, "grad_norm": 5.0, "skipped": 1.0, "kl_coef": pytest.approx(0.001)}


def test_extremes_are_the_smallest_and_largest_values_of_every_step_not_means():
    metrics = MetricAccumulator(torch.device("cpu"))
    for values in ([-1.5, 2.0], [0.5, 4.0]):  # two steps of two micro-batches
        for value in values:
            metrics.add_min("distillation/loss_min", torch.tensor(value))
            metrics.add_max("distillation/loss_max", torch.tensor(value))
        metrics.end_step()
    assert metrics.reduce() == {"distillation/loss_max": 4.0, "distillation/loss_min": -1.5}
