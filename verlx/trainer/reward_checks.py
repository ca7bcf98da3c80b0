"""Pre-flight checks of the reward keys verlx takes from veRL: the model-based reward model (reward_model.enable,
model.*, micro-batching), DAPO's reward_kwargs and reward_model.num_workers; run before Ray (trainer/preflight)."""

from __future__ import annotations

import os

from verlx.config.loader import Findings
from verlx.config.reward_model import REWARD_MODEL_STRATEGIES
from verlx.utils.batch_sizes import per_gpu_micro_batch_size
from verlx.utils.paths import expand_path


def check_rewards(cfg, f: Findings, world_size: int, check_files: bool = True) -> None:
    rm = cfg.reward_model
    f.require(rm.num_workers is None or rm.num_workers >= 0,
              f"reward_model.num_workers={rm.num_workers} must be >= 0 (it is verlx's reward.num_workers; 0 scores "
              "in the driver) or null")
    check_dapo_reward_kwargs(cfg, f)
    if rm.enable:
        check_reward_model(cfg, f, world_size)
        if check_files:
            check_reward_model_files(cfg, f)


def check_dapo_reward_kwargs(cfg, f: Findings) -> None:
    """veRL's DAPO manager asserts these; here they are errors naming the keys."""
    kwargs = cfg.reward_model.reward_kwargs
    buffer, key = kwargs.overlong_buffer_cfg, "reward_model.reward_kwargs"
    if not buffer.enable:
        return
    f.require(cfg.reward_model.reward_manager == "dapo",
              f"{key}.overlong_buffer_cfg.enable=true needs reward_model.reward_manager=dapo (it is "
              f"{cfg.reward_model.reward_manager}, which does not shape rewards by length)")
    f.require(not cfg.reward_model.overlong_buffer.enable,
              f"{key}.overlong_buffer_cfg (veRL 0.9.1's keys) and reward_model.overlong_buffer (the DAPO recipe's) are "
              "both enabled: they are one feature, set one of them")
    f.require(buffer.len > 0, f"{key}.overlong_buffer_cfg.len={buffer.len} must be > 0 when the penalty is enabled")
    if f.require(kwargs.max_resp_len is not None,
                 f"{key}.max_resp_len must be set when {key}.overlong_buffer_cfg.enable=true (the response length the "
                 f"penalty window ends at, usually data.max_response_length={cfg.data.max_response_length})"):
        f.require(kwargs.max_resp_len >= buffer.len,
                  f"{key}.max_resp_len={kwargs.max_resp_len} must be at least {key}.overlong_buffer_cfg.len="
                  f"{buffer.len}")


def check_reward_model(cfg, f: Findings, world_size: int) -> None:
    rm = cfg.reward_model
    f.require(rm.model.path is not None, "reward_model.enable=true needs reward_model.model.path (a HF "
              "sequence-classification checkpoint with one label)")
    f.choice("reward_model.strategy", rm.strategy, REWARD_MODEL_STRATEGIES)
    f.require(rm.ulysses_sequence_parallel_size == 1,
              f"reward_model.ulysses_sequence_parallel_size={rm.ulysses_sequence_parallel_size}: the reward model "
              "runs without sequence parallelism in verlx; set it to 1")
    micro = per_gpu_micro_batch_size(rm.micro_batch_size_per_gpu, rm.micro_batch_size, world_size)
    f.require(micro is None or micro > 0,
              f"reward_model.micro_batch_size_per_gpu (or micro_batch_size / {world_size} GPUs) = {micro} must be "
              "positive")
    f.require(rm.max_length is None or rm.max_length > 0, f"reward_model.max_length={rm.max_length} must be positive")
    longest = rm.max_length or cfg.data.max_prompt_length + cfg.data.max_response_length
    budget = rm.forward_max_token_len_per_gpu
    f.require(budget is None or budget >= longest,
              f"reward_model.forward_max_token_len_per_gpu={budget} is smaller than the longest reward-model input "
              f"({longest} tokens: reward_model.max_length, or data.max_prompt_length + data.max_response_length)")
    shaping = cfg.reward_model.overlong_buffer.enable or cfg.reward_model.reward_kwargs.overlong_buffer_cfg.enable
    if shaping and cfg.custom_reward_function.path is None:
        f.warnings.append("reward_model.enable=true without custom_reward_function.path: the reward model's score is "
                          "the reward (as in veRL), so DAPO's overlong penalty is not applied; a custom reward "
                          "function gets the score as extra_info['rm_score'] and is shaped")


def check_reward_model_files(cfg, f: Findings) -> None:
    model = cfg.reward_model.model
    if model.path is None:
        return
    directory = expand_path(model.path)
    if f.require(os.path.isdir(directory), f"reward_model.model.path: directory {model.path!r} does not exist (give a "
                 "local HF model directory or a hub id)"):
        f.require(os.path.isfile(os.path.join(directory, "config.json")),
                  f"reward_model.model.path: {model.path!r} has no config.json; is it a HuggingFace model directory?")
    if model.input_tokenizer is not None:
        f.require(os.path.isdir(expand_path(model.input_tokenizer)),
                  f"reward_model.model.input_tokenizer: directory {model.input_tokenizer!r} does not exist (the "
                  "policy's tokenizer; null scores the policy's tokens without re-templating)")
