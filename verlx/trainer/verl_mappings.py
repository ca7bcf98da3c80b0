"""veRL keys that verlx serves with a feature of its own under another name or shape: resolved once before Ray
(main_ppo.prepare), each mapping said once at start (INFO):

  reward_model.num_workers                      → reward.num_workers (verlx's scoring processes)
  reward_model.reward_kwargs.overlong_buffer_cfg → DAPO's overlong shaping (the recipe's reward_model.overlong_buffer)
  reward_model.model.input_tokenizer            → the batches keep the raw chat (data.return_raw_chat=true)
  actor_rollout_ref.rollout.layered_summon      → nothing to switch: verlx's weight push is per tensor already
  the profiler keys                             → verlx's phase profiler (workers/profiling.py)
  distillation's teacher pool and inference keys → a frozen FSDP teacher colocated like the reference
"""

from __future__ import annotations

from collections.abc import Callable

from verlx.config.schema import PPOConfig
from verlx.trainer.distillation_checks import distillation_mapping
from verlx.trainer.reward_scoring import reward_model_reads_raw_chat


def reward_workers(config: PPOConfig) -> list[str]:
    workers = config.reward_model.num_workers
    if workers is None:
        return []
    config.reward.num_workers = workers
    return [f"reward_model.num_workers={workers} (veRL: processes computing rewards) is verlx's reward.num_workers: "
            f"{workers} scoring processes"]


def dapo_reward_kwargs(config: PPOConfig) -> list[str]:
    kwargs = config.reward_model.reward_kwargs
    buffer = kwargs.overlong_buffer_cfg
    if not buffer.enable:
        return []
    return [f"reward_model.reward_kwargs.overlong_buffer_cfg (veRL 0.9.1's DAPO keys) drives verlx's DAPO overlong "
            f"shaping, the feature of reward_model.overlong_buffer: penalty = min(-(length - ({kwargs.max_resp_len} - "
            f"{buffer.len})) / {buffer.len} × {buffer.penalty_factor}, 0), window ending at "
            f"reward_kwargs.max_resp_len={kwargs.max_resp_len}"]


def reward_model_raw_chat(config: PPOConfig) -> list[str]:
    if not reward_model_reads_raw_chat(config) or config.data.return_raw_chat:
        return []
    config.data.return_raw_chat = True
    return ["reward_model.model.input_tokenizer is set: each response is decoded and the chat re-rendered with the "
            "reward model's template, which needs the prompt's messages, so data.return_raw_chat=true (veRL 0.9.1's "
            "default)"]


def layered_summon(config: PPOConfig) -> list[str]:
    if not config.actor_rollout_ref.rollout.layered_summon:
        return []
    return ["actor_rollout_ref.rollout.layered_summon=true: verlx's weight push to the rollout engine always gathers "
            "the sharded weights one tensor at a time (finer than veRL's layer by layer, LoRA merges included), so "
            "there is nothing to switch"]


def profiler(config: PPOConfig) -> list[str]:
    from verlx.workers.profile_plan import profiler_notes

    return profiler_notes(config)


MAPPINGS: tuple[Callable[[PPOConfig], list[str]], ...] = (
    reward_workers, dapo_reward_kwargs, reward_model_raw_chat, layered_summon, profiler, distillation_mapping)


def apply_verl_mappings(config: PPOConfig) -> list[str]:
    """Fold the veRL keys above onto verlx's features (the config is not changed after this, before Ray); the
    lines that say what each became."""
    return [note for mapping in MAPPINGS for note in mapping(config)]
