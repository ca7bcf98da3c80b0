"""Pre-flight checks of on-policy distillation (distillation.*), before Ray: what verlx's colocated FSDP teacher can
serve (one teacher, an estimator or top-k loss, the FSDP engine, the student's vocabulary), and veRL's own rules of the
section (k1 only as a reward, the vanilla policy loss, a teacher context that holds prompt and response)."""

from __future__ import annotations

from verlx.algorithms.distillation import ESTIMATOR_MODES, TOP_K_MODES, uses_teacher_topk
from verlx.config.loader import Findings
from verlx.config.schema import PPOConfig
from verlx.models.checkpoint_config import read_checkpoint_config, text_config


def check_distillation(cfg: PPOConfig, f: Findings) -> None:
    d = cfg.distillation
    if not d.enabled:
        return
    names = sorted(d.teachers)
    if not f.require(len(names) == 1, f"distillation.teacher_models has the teachers {names} (veRL drops the default "
                     "teacher_model entry once others are added): verlx does not support multi-teacher distillation "
                     "(samples routed to teachers by distillation.teacher_key) yet; give one teacher"):
        return
    strategy = cfg.actor_rollout_ref.actor.strategy
    f.require(strategy in ("fsdp", "fsdp2"), f"distillation.enabled=true with actor_rollout_ref.actor.strategy="
              f"{strategy}: verlx does not support distillation on the megatron engine yet (its teacher is an FSDP "
              "model colocated with the actor)")
    loss = d.distillation_loss
    f.choice("distillation.distillation_loss.loss_mode", loss.loss_mode, (*ESTIMATOR_MODES, *TOP_K_MODES))
    if loss.loss_mode in TOP_K_MODES:
        f.require((loss.topk or 0) >= 1, f"distillation.distillation_loss.topk={loss.topk} must be at least 1 with "
                  f"loss_mode={loss.loss_mode} (the teacher's tokens the forward KL runs over)")
    f.require(loss.use_policy_gradient or loss.loss_mode not in ("kl", "k1"),
              f"distillation.distillation_loss.loss_mode={loss.loss_mode} with use_policy_gradient=false: the "
              "gradient of k1 does not depend on the teacher (veRL refuses it too); use k3, or use_policy_gradient="
              "true")
    f.require(loss.policy_loss_mode == "vanilla", f"distillation.distillation_loss.policy_loss_mode="
              f"{loss.policy_loss_mode!r}: veRL's distillation has the vanilla policy loss only")
    if f.require(d.teacher.model_path is not None, f"distillation.enabled=true needs {d.teacher_key_prefix}."
                 "model_path (the teacher's HF model directory or hub id)"):
        _check_vocabulary(cfg, f)
    inference = d.teacher.inference
    needed = inference.prompt_length + inference.response_length + 1
    f.require(inference.max_model_len is None or inference.max_model_len >= needed,
              f"{d.teacher_key_prefix}.inference.max_model_len={inference.max_model_len} is "
              f"shorter than prompt_length + response_length + 1 = {needed} (veRL refuses it: the teacher reads "
              "the whole prompt and response)")


def _check_vocabulary(cfg: PPOConfig, f: Findings) -> None:
    """The teacher scores the student's token ids, so the two must share a vocabulary (config.json vocab_size,
    where both directories are here)."""
    student = read_checkpoint_config(cfg.actor_rollout_ref.model.path)
    teacher = read_checkpoint_config(cfg.distillation.teacher.model_path)
    if student is None or teacher is None:
        return
    sizes = text_config(student).get("vocab_size"), text_config(teacher).get("vocab_size")
    f.require(sizes[0] == sizes[1], f"{cfg.distillation.teacher_key_prefix}.model_path: the teacher's vocab_size "
              f"{sizes[1]} differs from the student's {sizes[0]} (actor_rollout_ref.model.path): verlx does not "
              "support distillation across tokenizers; the teacher must score the student's token ids")


def distillation_mapping(cfg: PPOConfig) -> list[str]:
    """The line said once at start: where verlx's teacher runs, and the keys that therefore are not used."""
    d = cfg.distillation
    if not d.enabled:
        return []
    inference = d.teacher.inference
    return [f"distillation: the teacher {d.teacher.model_path} is a frozen FSDP model in the training workers, "
            "colocated and offloaded like the reference (its log-probs of the sampled tokens are the step's "
            "'teacher' phase, batched with actor_rollout_ref.ref's settings); veRL's teacher pool and inference "
            f"server are not used: distillation.n_gpus_per_node={d.n_gpus_per_node}, nnodes={d.nnodes}, "
            f"teacher_models.{d.teacher_name}.num_replicas and inference.* (name={inference.name}, "
            f"tensor_model_parallel_size={inference.tensor_model_parallel_size}, gpu_memory_utilization="
            f"{inference.gpu_memory_utilization}); with one teacher, teacher_key={d.teacher_key} routes nothing"
            ] + ([f"distillation: loss_mode={d.distillation_loss.loss_mode} with use_policy_gradient=true uses the "
                  "top-k loss only as a per-token reward on the sampled tokens, so how the other tokens should move "
                  "is lost (veRL warns the same); use_policy_gradient=false minimises it directly"]
                 if uses_teacher_topk(d.distillation_loss) and d.distillation_loss.use_policy_gradient else [])
