"""The actor and critic workers on the megatron engine (strategy=megatron), on the CPU in one gloo process, against
the same workers on the FSDP engine: every phase gives the same numbers.

Critic: values, the GAE returns from them, a value update and the values after it. (The megatron critic worker
used to inherit compute_values/update_critic from the FSDP worker without the state they read, so its first
compute_values failed.) Actor: generation from weights pushed out of the megatron shards, log-probs, reference
log-probs, a policy update with a KL loss and the log-probs after it. (The megatron actor worker's update_actor
read an optimizer its actor did not have.)

Runs where megatron-core is installed (helpers/megatron_cpu.py says what runs on the CPU and why)."""

from __future__ import annotations

import os

import pytest
import torch
import torch.multiprocessing as mp

from helpers.e2e import make_config
from helpers.ppo_batches import ragged_ppo_batch
from verlx.algorithms.advantages import ADV_ESTIMATORS
from verlx.protocol import DataProto

MODEL_INPUTS = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask"]
# lr high enough that one update visibly moves the values; no weight decay: megatron exempts norms and biases
CRITIC = ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-3", "critic.optim.weight_decay=0.0",
          "critic.ppo_mini_batch_size=4", "critic.ppo_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=1",
          "critic.model.enable_gradient_checkpointing=false"]  # megatron recomputes with CUDA RNG states


ACTOR = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", "trainer.n_gpus_per_node=1",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"]


def _megatron_cpu():
    """fp32 with the local layers, the plain optimizer and no clipping (the FSDP twins clip at a bound they never
    reach); the PP=2 critic test below runs the distributed optimizer and clipping, which the CPU shim supports."""
    from verlx.config.engine import MegatronConfig

    return MegatronConfig(dtype="float32", use_transformer_engine="false", use_distributed_optimizer=False)


def _critic_config(tiny_model_dir, tmp_path, strategy: str, pp: int = 1):
    if strategy == "fsdp":
        return make_config(tiny_model_dir, tmp_path, tmp_path, *CRITIC, "critic.grad_clip=1e9")
    if pp > 1:  # as the GPU runs it: gradient clipping and the distributed optimizer (the CPU shim runs both)
        from verlx.config.engine import MegatronConfig

        cfg = make_config(tiny_model_dir, tmp_path, tmp_path, *CRITIC, "critic.strategy=megatron",
                          "critic.grad_clip=1.0", f"trainer.n_gpus_per_node={pp}")
        cfg.critic.megatron = MegatronConfig(dtype="float32", use_transformer_engine="false",
                                             pipeline_model_parallel_size=pp)
        return cfg
    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, *CRITIC, "critic.strategy=megatron", "critic.grad_clip=0.0")
    cfg.critic.megatron = _megatron_cpu()
    return cfg


def _actor_config(tiny_model_dir, tmp_path, strategy: str):
    if strategy == "fsdp":
        return make_config(tiny_model_dir, tmp_path, tmp_path, *ACTOR, "actor_rollout_ref.actor.grad_clip=1e9")
    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, *ACTOR, "actor_rollout_ref.actor.strategy=megatron",
                      "actor_rollout_ref.ref.strategy=megatron", "actor_rollout_ref.actor.grad_clip=0.0")
    cfg.actor_rollout_ref.actor.megatron = cfg.actor_rollout_ref.ref.megatron = _megatron_cpu()
    return cfg


def _rewards(data: DataProto) -> torch.Tensor:
    """1 at the last response token of every other sample, else 0."""
    mask = data.batch["response_mask"]
    last = mask.sum(-1) - 1
    rewards = torch.zeros(mask.shape)
    rewards[torch.arange(0, len(data), 2), last[::2]] = 1.0
    return rewards


def test_gae_through_the_megatron_critic_matches_fsdp(megatron_on_cpu, tiny_model_dir, tmp_path):
    from verlx.workers.critic_worker import CriticWorker

    data = ragged_ppo_batch(0, rows=8, critic=True)
    inputs = data.select(MODEL_INPUTS, [], [])
    workers = {s: CriticWorker(_critic_config(tiny_model_dir, tmp_path, s)) for s in ("megatron", "fsdp")}
    values, metrics, after = {}, {}, {}
    for name, worker in workers.items():
        worker.init_model()
        values[name] = worker.compute_values(inputs).batch["values"]
    advantages, returns = ADV_ESTIMATORS.get("gae")(token_level_rewards=_rewards(data),
                                                    response_mask=data.batch["response_mask"],
                                                    values=values["megatron"], gamma=1.0, lam=0.95)
    batch = inputs.union(DataProto({"values": values["megatron"], "returns": returns}))
    for name, worker in workers.items():
        metrics[name] = worker.update_critic(batch).meta_info["metrics"]
        after[name] = worker.compute_values(inputs).batch["values"]
    mask = data.batch["response_mask"].bool()
    # zero-initialised value heads: V = 0, so the returns are the rewards-to-go
    assert torch.equal(values["megatron"], torch.zeros(mask.shape)) and torch.equal(values["fsdp"], values["megatron"])
    assert returns[mask].abs().sum() > 0 and advantages[mask].std() > 0
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac", "critic/lr"):
        assert metrics["megatron"][key] == pytest.approx(metrics["fsdp"][key], rel=1e-5), key
    assert after["megatron"][mask].abs().min() > 0 and (after["megatron"][~mask] == 0).all()
    torch.testing.assert_close(after["megatron"], after["fsdp"], rtol=1e-5, atol=1e-7)


def test_megatron_actor_generates_scores_and_updates_like_fsdp(megatron_on_cpu, tiny_model_dir, tmp_path):
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    data = ragged_ppo_batch(0, rows=4, meta_info={"temperature": 1.0})
    mask = data.batch["response_mask"].bool()
    prompts = DataProto({k: data.batch[k][:, :6] for k in ("input_ids", "attention_mask", "position_ids")},
                        meta_info={"do_sample": False})
    results = {}
    for strategy in ("megatron", "fsdp"):
        worker = ActorRolloutRefWorker(_actor_config(tiny_model_dir, tmp_path, strategy), role="actor_rollout_ref")
        worker.init_model()
        responses = worker.generate_sequences(prompts).batch["responses"]  # greedy, from the pushed weights
        batch = data.select(deepcopy=True)
        log_probs = worker.compute_log_prob(batch).batch["old_log_probs"]
        batch.batch["ref_log_prob"] = worker.compute_ref_log_prob(batch).batch["ref_log_prob"]
        metrics = worker.update_actor(batch).meta_info["metrics"]
        results[strategy] = (responses, log_probs[mask], batch.batch["ref_log_prob"][mask], metrics,
                             worker.compute_log_prob(batch).batch["old_log_probs"][mask])
        if strategy == "megatron":
            from megatron.core import parallel_state as mpu

            mpu.destroy_model_parallel()  # the FSDP worker comes next in this process
    (responses, log_probs, ref, metrics, after), fsdp = results["megatron"], results["fsdp"]
    assert torch.equal(responses, fsdp[0])
    torch.testing.assert_close(log_probs, fsdp[1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ref, log_probs)  # no update yet: the reference is the policy
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/lr"):
        assert metrics[key] == pytest.approx(fsdp[3][key], rel=1e-5, abs=1e-7), key
    assert metrics["actor/optimizer_state_gb"] > 0
    assert (after - log_probs).abs().max() > 1e-3  # the update moved the policy, on both engines alike
    torch.testing.assert_close(after, fsdp[4], rtol=1e-5, atol=1e-5)


def _critic_phases(cfg, data: DataProto, checkpoint: str) -> dict:
    """Values, an update, values after it; the critic saved, and its values after a fresh critic loads it."""
    from verlx.workers.critic_worker import CriticWorker

    worker = CriticWorker(cfg)
    worker.init_model()
    before = worker.compute_values(data).batch["values"]
    metrics = worker.update_critic(data).meta_info["metrics"]
    after = worker.compute_values(data).batch["values"]
    worker.save_checkpoint(checkpoint)
    resumed = CriticWorker(cfg)
    resumed.init_model()
    resumed.load_checkpoint(checkpoint)
    return {"before": before, "metrics": metrics, "after": after,
            "reloaded": resumed.compute_values(data).batch["values"]}


def _pipeline_critic_rank(rank: int, port: int, model_dir: str, tmp: str) -> None:
    from helpers.megatron_cpu import cuda_as_cpu

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    cfg = _critic_config(model_dir, tmp, "megatron", pp=2)
    with pytest.MonkeyPatch.context() as monkeypatch, cuda_as_cpu(monkeypatch):
        result = _critic_phases(cfg, ragged_ppo_batch(0, rows=8, critic=True), os.path.join(tmp, "pp2_critic"))
    torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))


def test_megatron_critic_at_pp2_matches_one_stage_and_resumes(megatron_on_cpu, tiny_model_dir, tmp_path):
    """The critic with its layers over 2 pipeline stages (2 gloo processes) gives one stage's loss, gradient norm
    and values after an update, and its PP=2 checkpoint reloads to the same values. On 2 x H100 its first update
    failed ('NoneType' object has no attribute 'weight'): megatron all-reduced the tied embedding's gradient with
    the last stage's vocabulary projection, which a critic drops (and its checkpoint needed that projection too)."""
    from verlx.utils.distributed import free_port

    mp.spawn(_pipeline_critic_rank, args=(free_port(), tiny_model_dir, str(tmp_path)), nprocs=2)
    stages = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    cfg = _critic_config(tiny_model_dir, tmp_path, "megatron", pp=2)
    cfg.critic.megatron.pipeline_model_parallel_size, cfg.trainer.n_gpus_per_node = 1, 1
    one = _critic_phases(cfg, ragged_ppo_batch(0, rows=8, critic=True), str(tmp_path / "pp1_critic"))
    last = stages[1]  # the last stage holds the value head, the values and the metrics
    mask = ragged_ppo_batch(0, rows=8).batch["response_mask"].bool()
    assert torch.equal(last["before"], torch.zeros(mask.shape)) and torch.equal(one["before"], last["before"])
    assert stages[0]["metrics"].get("critic/vf_loss") is None  # the first stage has no loss to report
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vf_clipfrac", "critic/vpred_mean"):
        assert last["metrics"][key] == pytest.approx(one["metrics"][key], rel=1e-5), key
    assert last["after"][mask].abs().min() > 0 and (last["after"][~mask] == 0).all()
    torch.testing.assert_close(last["after"], one["after"], rtol=1e-5, atol=1e-7)
    assert torch.equal(last["reloaded"], last["after"]) and torch.equal(one["reloaded"], one["after"])
