"""The reward of a generated batch: the reward model's scores first (reward_model.enable, the colocated
RewardModelWorker), then the reward manager, which takes them as the reward (veRL: a reward manager returns
rm_scores when present) or hands them to custom_reward_function as extra_info["rm_score"]."""

from __future__ import annotations

from verlx.batch_columns import MODEL_INPUTS, RESPONSES
from verlx.protocol import DataProto
from verlx.reward.managers import RewardResult

RM_INPUTS = (*MODEL_INPUTS, RESPONSES)


def reward_model_reads_raw_chat(config) -> bool:
    return config.reward_model.enable and config.reward_model.model.input_tokenizer is not None


class RewardScorer:
    """`scorer(batch)`: rm_scores into the batch (when there is a reward model), then the manager's RewardResult,
    with the reward model's phase metrics among its metrics."""

    def __init__(self, config, reward_fn, reward_model_group=None, world_size: int = 1):
        self.reward_fn = reward_fn
        self.group = reward_model_group
        self.world_size = world_size
        self.non_tensor_inputs = ["raw_prompt"] if reward_model_reads_raw_chat(config) else []

    def __call__(self, batch: DataProto) -> RewardResult:
        metrics = {}
        if self.group is not None:
            inputs, pad = batch.select(list(RM_INPUTS), self.non_tensor_inputs, []).pad_to_divisor(self.world_size)
            scored = self.group.compute_rm_score(inputs).unpad(pad)
            batch.batch["rm_scores"] = scored.batch["rm_scores"]
            metrics = scored.meta_info.get("metrics", {})
        result = self.reward_fn(batch)
        result.metrics.update(metrics)
        return result
