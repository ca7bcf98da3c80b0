"""veRL's on-policy distillation overrides of examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh (its
EXTRA array, small values) with a tiny teacher: the config tests and the end-to-end run read the same script."""

from __future__ import annotations


def script_distillation_overrides(teacher: str) -> list[str]:
    return ["distillation.enabled=True", "distillation.n_gpus_per_node=4", "distillation.nnodes=1",
            f"distillation.teacher_models.teacher_model.model_path={teacher}",
            "distillation.teacher_models.teacher_model.inference.tensor_model_parallel_size=2",
            "distillation.teacher_models.teacher_model.inference.name=vllm",
            "distillation.teacher_models.teacher_model.inference.gpu_memory_utilization=0.4",
            "distillation.teacher_models.teacher_model.inference.max_model_len=41",
            "distillation.distillation_loss.loss_mode=k1", "distillation.distillation_loss.topk=64",
            "distillation.distillation_loss.use_task_rewards=False",
            "distillation.distillation_loss.use_policy_gradient=True",
            "distillation.distillation_loss.loss_max_clamp=10.0",
            "distillation.distillation_loss.log_prob_min_clamp=-10.0"]
