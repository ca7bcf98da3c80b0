"""The columns of the PPO batch (DataProto), named once: what each holds and which phase writes it.

The names are veRL's, spelling included (`old_log_probs` beside `ref_log_prob`, `entropys`): custom reward
functions, estimators and losses written for veRL read them. Tensors are [B, T] over prompt + response
(`input_ids`...), [B, R] over the response (`responses`, `response_mask` and everything per response token) or [B]
per row. tests/unit/test_batch_columns.py fails when code indexes a batch with a literal name that is not here.
"""

from __future__ import annotations

from collections.abc import Mapping

# ---------------------------------------------------------------------- the model's inputs (prompt + response)
INPUT_IDS = "input_ids"
ATTENTION_MASK = "attention_mask"
POSITION_IDS = "position_ids"
#: what every forward pass reads
MODEL_INPUTS = (INPUT_IDS, ATTENTION_MASK, POSITION_IDS)
#: a vision-language row's vision inputs (non-tensor: a dict of pixel_values and image_grid_thw per row, empty
#: without image; verlx.models.vision), carried wherever MODEL_INPUTS go
MULTI_MODAL_INPUTS = "multi_modal_inputs"
NON_TENSOR_MODEL_INPUTS = (MULTI_MODAL_INPUTS,)
#: a vision-language row's decoded images (non-tensor: {"image": [PIL RGB images]} per row, empty without image;
#: veRL's name), what the image processor made multi_modal_inputs from: engines that process images themselves
#: (SGLang, vLLM) take them with the prompt. Only generation reads it.
MULTI_MODAL_DATA = "multi_modal_data"
NON_TENSOR_GENERATION_INPUTS = (*NON_TENSOR_MODEL_INPUTS, MULTI_MODAL_DATA)


def non_tensor_inputs(non_tensor_batch: Mapping) -> list[str]:
    """The non-tensor model inputs a batch has (its `non_tensor_batch`): select them along with MODEL_INPUTS."""
    return [key for key in NON_TENSOR_MODEL_INPUTS if key in non_tensor_batch]


def non_tensor_generation_inputs(non_tensor_batch: Mapping) -> list[str]:
    """What generation reads beside MODEL_INPUTS: the non-tensor model inputs and the rows' images."""
    return [key for key in NON_TENSOR_GENERATION_INPUTS if key in non_tensor_batch]


def select_inputs(batch, keys):
    """A DataProto's tensors `keys` with the non-tensor model inputs it has, without meta_info: what a phase that
    runs the model sends to the workers."""
    return batch.select(list(keys), non_tensor_inputs(batch.non_tensor_batch), [])


# ---------------------------------------------------------------------- rollout (rollout/base.py: the shared layout)
PROMPTS = "prompts"
RESPONSES = "responses"
RESPONSE_MASK = "response_mask"
ROLLOUT_LOG_PROBS = "rollout_log_probs"
#: what a log-prob or value forward reads
LOG_PROB_INPUTS = (*MODEL_INPUTS, RESPONSES, RESPONSE_MASK)
# partial rollout (rollout/generation.py): what earlier calls generated, and how this call ended
PARTIAL_RESPONSES = "partial_responses"
PARTIAL_LOG_PROBS = "partial_log_probs"
PARTIAL_LENGTHS = "partial_lengths"
PARTIAL_COLUMNS = (PARTIAL_RESPONSES, PARTIAL_LOG_PROBS, PARTIAL_LENGTHS)
ROLLOUT_FINISHED = "rollout_finished"
ROLLOUT_NEW_TOKENS = "rollout_new_tokens"
# policy versions (trainer/rollout_modes/staleness.py)
POLICY_VERSION = "rollout_policy_version"
POLICY_VERSION_LAST = "rollout_policy_version_last"
TOKEN_VERSIONS = "rollout_token_versions"

# ---------------------------------------------------------------------- log-probs, values
OLD_LOG_PROBS = "old_log_probs"
ENTROPYS = "entropys"
SUM_PI_SQUARED = "sum_pi_squared"
REF_LOG_PROB = "ref_log_prob"
TEACHER_LOG_PROB = "teacher_log_prob"
TEACHER_TOPK_IDS = "teacher_topk_ids"
TEACHER_TOPK_LOG_PROBS = "teacher_topk_log_probs"
TEACHER_COLUMNS = (TEACHER_LOG_PROB, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS)
FULL_KL = "full_kl"
VALUES = "values"
ROLLOUT_IS_WEIGHTS = "rollout_is_weights"

# ---------------------------------------------------------------------- rewards and advantages
RM_SCORES = "rm_scores"
TOKEN_LEVEL_SCORES = "token_level_scores"
TOKEN_LEVEL_REWARDS = "token_level_rewards"
REWARD_BASELINES = "reward_baselines"
ADVANTAGES = "advantages"
RETURNS = "returns"

# ---------------------------------------------------------------------- per-row Python values (non_tensor_batch)
UID = "uid"
RAW_PROMPT = "raw_prompt"
REWARD_STATUS = "reward_status"

#: every column, with what it holds
COLUMNS = {
    INPUT_IDS: "prompt (left-padded) + response token ids [B, T]",
    ATTENTION_MASK: "1 for real tokens of input_ids [B, T]",
    POSITION_IDS: "positions of input_ids [B, T]; [B, 4, T] for a vision-language model (text, then M-RoPE's "
                  "time, height and width axes)",
    MULTI_MODAL_INPUTS: "a vision-language row's pixel_values and image_grid_thw (non-tensor dict)",
    MULTI_MODAL_DATA: "a vision-language row's decoded images, {'image': [PIL images]} (non-tensor dict)",
    PROMPTS: "the left-padded prompt ids [B, P]",
    RESPONSES: "generated ids, right-padded [B, R]",
    RESPONSE_MASK: "1 for generated tokens up to and including the stop token [B, R]",
    ROLLOUT_LOG_PROBS: "the rollout engine's log-probs of the responses [B, R]",
    PARTIAL_RESPONSES: "partial rollout: tokens earlier calls generated [B, R]",
    PARTIAL_LOG_PROBS: "partial rollout: their log-probs [B, R]",
    PARTIAL_LENGTHS: "partial rollout: how many there are [B]",
    ROLLOUT_FINISHED: "partial rollout: the row ended (stop token or length) [B]",
    ROLLOUT_NEW_TOKENS: "partial rollout: tokens this call generated [B]",
    POLICY_VERSION: "the policy version that generated the row's first token [B]",
    POLICY_VERSION_LAST: "the policy version of its last token [B]",
    TOKEN_VERSIONS: "partial rollout: the policy version of each response token [B, R]",
    OLD_LOG_PROBS: "the actor's log-probs before the update [B, R]",
    ENTROPYS: "the actor's per-token entropy [B, R]",
    SUM_PI_SQUARED: "sum over the vocabulary of p^2 per token [B, R]",
    REF_LOG_PROB: "the reference model's log-probs [B, R]",
    TEACHER_LOG_PROB: "on-policy distillation: the teacher's log-probs of the sampled tokens [B, R]",
    TEACHER_TOPK_IDS: "on-policy distillation, loss_mode=forward_kl_topk: the teacher's k likeliest next tokens at "
                      "each response position [B, R, k]",
    TEACHER_TOPK_LOG_PROBS: "their log-probs under the teacher [B, R, k]",
    FULL_KL: "the full-vocabulary KL to the reference per token [B, R]",
    VALUES: "the critic's values [B, R]",
    ROLLOUT_IS_WEIGHTS: "rollout correction's importance weights per token [B, R]",
    RM_SCORES: "the reward model's scores [B, R]",
    TOKEN_LEVEL_SCORES: "the reward manager's scores [B, R]",
    TOKEN_LEVEL_REWARDS: "scores minus the KL penalty in the reward [B, R]",
    REWARD_BASELINES: "REMAX's greedy-rollout reward [B]",
    ADVANTAGES: "the estimator's advantages [B, R]",
    RETURNS: "the estimator's returns [B, R]",
    UID: "the prompt group a row belongs to (non-tensor)",
    RAW_PROMPT: "the chat messages of the prompt (non-tensor)",
    REWARD_STATUS: "ok, error or timeout of the row's scoring (non-tensor)",
}
