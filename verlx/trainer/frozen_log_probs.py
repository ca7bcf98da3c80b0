"""The step's phases that score the sampled responses with a frozen model: the reference (KL) and, for on-policy
distillation, the teacher."""

from __future__ import annotations

from verlx.batch_columns import LOG_PROB_INPUTS, TEACHER_COLUMNS, select_inputs
from verlx.protocol import DataProto
from verlx.utils.timer import timed


def reference_log_probs(actor_wg, batch: DataProto, metrics: dict, timing: dict) -> None:
    """batch['ref_log_prob'] (and 'full_kl' for the exact in-reward KL)."""
    with timed("ref", timing):
        ref = actor_wg.compute_ref_log_prob(select_inputs(batch, LOG_PROB_INPUTS))
        metrics.update(ref.meta_info.get("metrics", {}))
        batch.batch["ref_log_prob"] = ref.batch["ref_log_prob"]
        if "full_kl" in ref.batch:
            batch.batch["full_kl"] = ref.batch["full_kl"]


def teacher_log_probs(actor_wg, batch: DataProto, metrics: dict, timing: dict) -> None:
    """The teacher's columns: batch['teacher_log_prob'], its log-probs of the tokens the student sampled, or with
    loss_mode=forward_kl_topk batch['teacher_topk_ids'] and ['teacher_topk_log_probs'] (its top-k at each
    position)."""
    with timed("teacher", timing):
        teacher = actor_wg.compute_teacher_log_prob(select_inputs(batch, LOG_PROB_INPUTS))
        metrics.update(teacher.meta_info.get("metrics", {}))
        for name in TEACHER_COLUMNS:
            if name in teacher.batch:
                batch.batch[name] = teacher.batch[name]
