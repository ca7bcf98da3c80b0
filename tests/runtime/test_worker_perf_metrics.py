"""The FSDP workers in one process (a 1-rank gloo group): each phase reports perf/mfu/<phase> computed from the
sequences it processed and its compute time, and CPU-only runs ignore param/optimizer offload with one warning."""

from __future__ import annotations

import warnings
from contextlib import contextmanager

import pytest

from helpers.e2e import make_config
from helpers.ppo_batches import ragged_ppo_batch
from verlx.metrics.throughput import step_memory_peak
from verlx.protocol import DataProto
from verlx.utils.flops import dense_decoder_flops
from verlx.workers import perf
from verlx.workers.fsdp import offload

SECONDS, PEAK, EPOCHS = 0.5, 4.0, 2


@pytest.fixture
def fixed_phases(one_rank, monkeypatch):
    """One rank whose every phase "takes" SECONDS on a device of PEAK TFLOP/s, so the expected MFU is exact."""
    monkeypatch.setenv("VERLX_PEAK_TFLOPS", str(PEAK))

    @contextmanager
    def fixed_measure(self):
        yield self
        self.seconds = SECONDS

    monkeypatch.setattr(perf.PhaseTimer, "measure", fixed_measure)
    monkeypatch.setattr(offload, "_warned", set())  # "one warning per process": start from none


def _batch(rows: int = 8) -> DataProto:
    return ragged_ppo_batch(0, rows=rows, critic=True)


def _mfu(hf_config, seq_lens, forward_only=False) -> float:
    flops = dense_decoder_flops(hf_config, seq_lens) / (3 if forward_only else 1)
    return flops / SECONDS / 1e12 / PEAK


def test_phase_mfu_from_the_rank_sequences_and_offload_ignored_on_cpu(fixed_phases, tiny_model_dir, tmp_path, caplog):
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from verlx.workers.critic_worker import CriticWorker

    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1",
                      "algorithm.adv_estimator=gae", f"actor_rollout_ref.actor.ppo_epochs={EPOCHS}",
                      "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                      "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
                      "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                      "critic.model.fsdp_config.param_offload=true", "critic.ppo_epochs=1")
    with caplog.at_level("WARNING"):
        actor = ActorRolloutRefWorker(cfg, role="actor_ref")
        actor.init_model()
        critic = CriticWorker(cfg)
        critic.init_model()
    offload_warnings = [r.message for r in caplog.records if "are ignored on a CPU-only run" in r.message]
    assert len(offload_warnings) == 1, offload_warnings

    data = _batch()
    seq_lens = data.batch["attention_mask"].sum(-1).tolist()
    hf_config = actor.hf_config
    old = actor.compute_log_prob(data)
    assert old.meta_info["metrics"] == {"perf/mfu/actor_infer": pytest.approx(_mfu(hf_config, seq_lens, True))}
    ref = actor.compute_ref_log_prob(data)
    assert ref.meta_info["metrics"] == {"perf/mfu/ref": pytest.approx(_mfu(hf_config, seq_lens, True))}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = actor.update_actor(data).meta_info["metrics"]
    # two epochs over the rank's 8 sequences
    assert metrics["perf/mfu/actor"] == pytest.approx(_mfu(hf_config, seq_lens * EPOCHS))
    values = critic.compute_values(data)
    assert values.meta_info["metrics"] == {"perf/mfu/critic_infer": pytest.approx(_mfu(hf_config, seq_lens, True))}
    with warnings.catch_warnings(record=True) as caught_critic:
        warnings.simplefilter("always")
        critic_metrics = critic.update_critic(data).meta_info["metrics"]
    # FSDP roots return tensors they own (an in-place op on a returned view would skip the pre-backward hook)
    assert not [w for w in caught + caught_critic if "view tensor" in str(w.message)]
    assert critic_metrics["perf/mfu/critic"] == pytest.approx(_mfu(hf_config, seq_lens))
    assert not any(k.startswith("perf/max_memory_allocated_gb") for k in {**metrics, **critic_metrics})
    assert step_memory_peak({**metrics, **critic_metrics}) == {}  # CPU: no memory peak to report


def test_step_memory_peak_is_the_largest_phase_peak():
    phases = {"perf/max_memory_allocated_gb/actor": 30.5, "perf/max_memory_allocated_gb/actor_infer": 12.0,
              "perf/mfu/actor": 0.4}
    assert step_memory_peak(phases) == {"perf/max_memory_allocated_gb": 30.5}


def test_generation_peak_memory_enters_the_step_peak(fixed_phases, tiny_model_dir, tmp_path, monkeypatch):
    """generate_sequences reports perf/max_memory_allocated_gb/gen like the other phases: the rollout (engine weights
    and KV cache on top of the resident training state) is often the step's peak, which step_memory_peak must see.
    On the CPU there is no peak to read, so the timer is given one per phase: 3 GiB for generation, 1 GiB after."""
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    peaks = iter([3 * 2**30] + [2**30] * 10)

    @contextmanager
    def measure_with_peak(self):
        yield self
        self.peak_bytes = next(peaks)

    monkeypatch.setattr(perf.PhaseTimer, "measure", measure_with_peak)
    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1")
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout")
    worker.init_model()
    prompts = _batch(rows=4).select(["input_ids", "attention_mask", "position_ids"], [], [])
    prompts = DataProto({k: v[:, :6] for k, v in prompts.batch.items()}, meta_info={"do_sample": False})
    out = worker.generate_sequences(prompts)
    assert out.meta_info["metrics"] == {"perf/max_memory_allocated_gb/gen": 3.0}
    data = _batch(rows=4)
    update = worker.update_actor(data).meta_info["metrics"]
    assert update["perf/max_memory_allocated_gb/actor"] == 1.0
    assert step_memory_peak({**out.meta_info["metrics"], **update}) == {"perf/max_memory_allocated_gb": 3.0}


def test_every_role_of_the_process_leaves_the_sleeping_engines_unbacked_bytes_out_of_its_peak(
        fixed_phases, tiny_model_dir, tmp_path, monkeypatch):
    """An in-process engine that sleeps with memory unmapped under tensors torch still counts (vLLM's pool) makes
    every phase's allocator peak too high, in whichever role of the colocated process runs it: the actor's phases
    and the critic's leave those bytes out, generation (the engine awake) keeps its peak. On the CPU the timer is
    given a peak of 5 GiB per phase and the engine 2 GiB asleep."""
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from verlx.workers.critic_worker import CriticWorker

    @contextmanager
    def measure_with_peak(self):
        yield self
        self.peak_bytes = 5 * 2**30 - self.unbacked_bytes

    monkeypatch.setattr(perf.PhaseTimer, "measure", measure_with_peak)
    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae")
    actor = ActorRolloutRefWorker(cfg, role="actor_rollout")
    actor.init_model()
    critic = CriticWorker(cfg)
    critic.init_model()
    monkeypatch.setattr(actor.engine, "unbacked_allocated_bytes", lambda: 2 * 2**30)
    prompts = _batch(rows=4).select(["input_ids", "attention_mask", "position_ids"], [], [])
    prompts = DataProto({k: v[:, :6] for k, v in prompts.batch.items()}, meta_info={"do_sample": False})
    gen = actor.generate_sequences(prompts).meta_info["metrics"]
    assert gen["perf/max_memory_allocated_gb/gen"] == 5.0
    data = _batch(rows=4)
    assert actor.update_actor(data).meta_info["metrics"]["perf/max_memory_allocated_gb/actor"] == 3.0
    assert critic.compute_values(data).meta_info["metrics"]["perf/max_memory_allocated_gb/critic_infer"] == 3.0
    actor.close()  # the engine gone: nothing left out
    assert critic.update_critic(data).meta_info["metrics"]["perf/max_memory_allocated_gb/critic"] == 5.0
