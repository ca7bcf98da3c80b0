"""The one_step_off / async pipeline's scheduling against a scripted rollout group (no Ray): which batch is
generated with which weights, staleness sequences, drops, partial rollouts and the data position it reports.

The real worker groups are exercised in tests/e2e/test_async_modes.py; here generation takes a scripted number
of waits, so every sequence is exact."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from verlx.batch_columns import POLICY_VERSION, POLICY_VERSION_LAST, TOKEN_VERSIONS
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto
from verlx.rollout.base import build_rollout_batch
from verlx.trainer.rollout_modes.pipeline import RolloutPipeline, RolloutStalled
from verlx.trainer.rollout_modes.staleness import staleness_metrics

RESPONSE = 4  # data.max_response_length
ROWS = 2  # samples per prompt batch


class ScriptedCall:
    """A generation that finishes after `ticks` waits, or at once (with half its tokens) when interrupted."""

    def __init__(self, wg, inputs: DataProto, ticks: int):
        self.wg, self.inputs, self.ticks, self.waited = wg, inputs, ticks, 0

    def done(self) -> bool:
        return self.waited >= self.ticks or self.inputs.meta_info.get("generation_id") in self.wg.interrupted

    def wait(self, timeout_s: float) -> bool:
        self.waited += 1
        return self.done()

    def get(self, timeout_s=None) -> DataProto:
        assert self.done()
        interrupted = self.inputs.meta_info.get("generation_id") in self.wg.interrupted and self.waited < self.ticks
        start = (self.inputs.batch["partial_lengths"] if "partial_lengths" in self.inputs.batch
                 else torch.zeros(len(self.inputs), dtype=torch.long))
        end = torch.clamp(start + (RESPONSE // 2 if interrupted else RESPONSE), max=RESPONSE)
        mask = torch.arange(RESPONSE)[None, :] < end[:, None]
        responses = torch.where(mask, 7, 0)
        prompts = self.inputs.select(batch_keys=["input_ids", "attention_mask", "position_ids"])
        out = build_rollout_batch(prompts, responses, mask, torch.zeros(len(self.inputs), RESPONSE), 1)
        if "generation_id" in self.inputs.meta_info:
            out.batch["rollout_finished"] = end >= RESPONSE
        out.meta_info = {"timing": {"timing_s/rollout_worker": 0.5}, "wall_clock": (1.0, 2.0)}
        return out


class ScriptedWorkers:
    world_size = 1

    def __init__(self, group, ticks: int):
        self.group, self.ticks = group, ticks
        self.launches: list[tuple[int, int, int]] = []  # (prompt batch, weights version, rows)
        self.interrupted: set[int] = set()

    @property
    def generate_sequences(self):
        """The group method's shape: `group.generate_sequences.submit(inputs)` returns a future."""
        return types.SimpleNamespace(submit=self._submit_generation)

    def _submit_generation(self, inputs: DataProto) -> ScriptedCall:
        self.launches.append((inputs.meta_info["global_step"], self.group.version, len(inputs)))
        return ScriptedCall(self, inputs, self.ticks)

    def interrupt_generation(self, generation_id: int) -> None:
        self.interrupted.add(generation_id)


class ScriptedGroup:
    def __init__(self, ticks: int = 0):
        self.version = None
        self.syncs: list[int] = []
        self.wg = ScriptedWorkers(self, ticks)

    def sync_weights(self, version: int, timeout_s=None) -> None:
        self.version = version
        self.syncs.append(version)


class Loader:
    def __init__(self):
        self.position = 0

    def batches(self):
        while True:
            self.position += 1
            ids = torch.full((1, 3), self.position)
            yield DataProto({"input_ids": ids, "attention_mask": torch.ones(1, 3, dtype=torch.long),
                             "position_ids": torch.arange(3)[None]})

    def state_dict(self) -> dict:
        return {"sampler": {"epoch": 0, "position": self.position}}


def make_pipeline(group, *overrides, first_index=1, last_index=100):
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[
        f"data.max_response_length={RESPONSE}", "actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1",
        *overrides])))
    loader = Loader()
    state = {"version": 0}

    def expand(batch):
        batch.non_tensor_batch["uid"] = np.array(["u"], dtype=object)
        return batch.repeat(ROWS)

    def gen_inputs(batch):
        return batch.select(["input_ids", "attention_mask", "position_ids"], [], [])

    pipeline = RolloutPipeline(cfg, group, loader.batches(), loader, expand, gen_inputs, lambda: state["version"],
                               first_index, last_index)
    return pipeline, state


def train(pipeline, state, steps: int, mid_step_pump: bool = False) -> list:
    """What the trainer does: take a batch, (pump after a phase), update (version = step), pump."""
    items = []
    for step in range(1, steps + 1):
        item = pipeline.next()
        items.append((item, state["version"]))
        if mid_step_pump:
            pipeline.pump()
        state["version"] = step
        pipeline.pump()
    return items


def staleness(items) -> list[int]:
    return [version - int(item.batch.batch[POLICY_VERSION].min()) for item, version in items]


@pytest.mark.parametrize("mode,bound,expected", [
    (["trainer.rollout_mode=async", "trainer.max_staleness=0"], 0, [0, 0, 0, 0, 0]),
    (["trainer.rollout_mode=one_step_off"], 1, [0, 1, 1, 1, 1]),
    (["trainer.rollout_mode=async", "trainer.max_staleness=2"], 2, [0, 1, 2, 2, 2]),
])
def test_a_fast_rollout_group_runs_exactly_max_staleness_ahead(mode, bound, expected):
    group = ScriptedGroup(ticks=0)
    pipeline, state = make_pipeline(group, *mode)
    items = train(pipeline, state, 5)
    assert staleness(items) == expected
    assert [item.index for item, _ in items] == [1, 2, 3, 4, 5]
    # batch j is generated with version max(0, j - 1 - bound): started as soon as the bound allows, never earlier
    assert [(j, v) for j, v, _ in group.wg.launches][:5] == [(j, max(0, j - 1 - bound)) for j in range(1, 6)]
    for item, version in items:
        metrics = staleness_metrics(item.batch, version, bound)
        assert metrics["async/staleness/max"] <= bound
        assert metrics["async/staleness/hist/" + str(int(metrics["async/staleness/max"]))] == ROWS


def test_bound_zero_generates_every_batch_with_the_newest_weights_like_sync():
    group = ScriptedGroup(ticks=1)
    pipeline, state = make_pipeline(group, "trainer.rollout_mode=async", "trainer.max_staleness=0", last_index=4)
    items = train(pipeline, state, 4, mid_step_pump=True)
    assert staleness(items) == [0, 0, 0, 0]
    assert group.syncs == [0, 1, 2, 3]  # one broadcast per step, before that step's generation; none after the last
    assert [launch[:2] for launch in group.wg.launches] == [(1, 0), (2, 1), (3, 2), (4, 3)]


def test_the_saved_data_position_is_that_of_the_last_consumed_batch():
    group = ScriptedGroup(ticks=0)
    pipeline, state = make_pipeline(group, "trainer.rollout_mode=async", "trainer.max_staleness=2")
    items = train(pipeline, state, 2)
    assert pipeline.loader.position == 5  # prompt batches 3, 4 and 5 were taken ahead (version 2 + bound 2)
    assert pipeline.consumed_loader_state == {"sampler": {"epoch": 0, "position": 2}}
    assert [item.loader_state["sampler"]["position"] for item, _ in items] == [1, 2]


def test_drop_policy_drops_batches_over_the_bound_and_counts_them():
    group = ScriptedGroup(ticks=0)
    pipeline, state = make_pipeline(group, "trainer.rollout_mode=async", "trainer.max_staleness=0",
                                    "trainer.staleness_policy=drop")
    items = train(pipeline, state, 3, mid_step_pump=True)
    # the mid-step pump starts the next batch before the update: one version too old by the time it is taken
    assert staleness(items) == [0, 0, 0]
    assert [item.index for item, _ in items] == [1, 3, 5]
    assert [item.dropped for item, _ in items] == [0, ROWS, ROWS]
    fractions = [staleness_metrics(item.batch, version, 0, item.dropped)["async/dropped_fraction"]
                 for item, version in items]
    assert fractions == [0.0, 0.5, 0.5]
    assert items[-1][0].metrics["async/dropped_samples_total"] == 2 * ROWS
    assert pipeline.consumed_loader_state["sampler"]["position"] == 5


def test_partial_rollout_continues_interrupted_samples_with_the_new_weights():
    group = ScriptedGroup(ticks=2)
    pipeline, state = make_pipeline(group, "trainer.rollout_mode=async", "trainer.max_staleness=1",
                                    "trainer.partial_rollout=true", "actor_rollout_ref.rollout.name=native")
    items = train(pipeline, state, 3)
    first, second, third = (item.batch.batch for item, _ in items)
    assert first[TOKEN_VERSIONS].tolist() == [[0, 0, 0, 0]] * ROWS  # generated before any update
    # batch 2 started with version 0, was interrupted by update 1 after 2 tokens and finished with version 1
    assert second[TOKEN_VERSIONS].tolist() == [[0, 0, 1, 1]] * ROWS
    assert second[POLICY_VERSION].tolist() == [0] * ROWS and second[POLICY_VERSION_LAST].tolist() == [1] * ROWS
    assert third[TOKEN_VERSIONS].tolist() == [[1, 1, 2, 2]] * ROWS
    assert staleness(items) == [0, 1, 1]
    assert group.wg.interrupted == {1, 3, 5}  # batches 2, 3 and 4 were each running when an update landed
    # (prompt batch, weights, rows): each continuation re-submits the unfinished samples after the broadcast
    assert group.wg.launches[:5] == [(1, 0, ROWS), (2, 0, ROWS), (2, 1, ROWS), (3, 1, ROWS), (3, 2, ROWS)]
    assert staleness_metrics(items[1][0].batch, 1, 1)["async/partial_samples"] == ROWS


def test_a_rollout_group_that_delivers_nothing_stops_the_run_naming_what_it_was_doing():
    group = ScriptedGroup(ticks=10**9)
    pipeline, _ = make_pipeline(group, "trainer.rollout_mode=one_step_off", "trainer.rollout_stall_timeout_s=0.3")
    with pytest.raises(RolloutStalled, match=r"delivered nothing for \d+s .*generating prompt batch 1 with policy "
                                             r"version 0 \(generate_sequences on 2 samples"):
        pipeline.next()
