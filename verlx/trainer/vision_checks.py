"""What a run on a vision-language policy (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) asks for that verlx does not do with one
yet: refused before Ray, each naming the feature and its key. The rollout engine's image input is a capability
(rollout/capabilities.py); the rest is here."""

from __future__ import annotations

from verlx.algorithms.advantages import uses_critic
from verlx.models.vision import SUPPORTED_MODEL_TYPES, checkpoint_model_type, checkpoint_patch_size

#: the data.image_patch_size veRL's configs carry for every model (Qwen2-VL's patch size)
VERL_DEFAULT_PATCH_SIZE = 14


def _unsupported(cfg) -> list[tuple[str, str]]:
    """The features the config turns on that the vision-language path lacks, each with its key."""
    arr = cfg.actor_rollout_ref
    try:
        critic = uses_critic(cfg)
    except KeyError:  # an unknown estimator: the name checks report it
        critic = False
    features = [
        ("the megatron training engine", f"actor_rollout_ref.actor.strategy={arr.actor.strategy}",
         arr.actor.strategy == "megatron"),
        ("Ulysses sequence parallelism",
         f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size}",
         arr.actor.ulysses_sequence_parallel_size > 1),
        ("LoRA", f"actor_rollout_ref.model.lora_rank={arr.model.lora_rank}", arr.model.lora_rank > 0),
        ("a critic", f"algorithm.adv_estimator={cfg.algorithm.adv_estimator}", critic),
        ("a reward model", "reward_model.enable=true", cfg.reward_model.enable),
        ("the agent loop", "actor_rollout_ref.rollout.mode=async or multi_turn.enable=true",
         arr.rollout.uses_agent_loop),
        ("asynchronous rollout modes", f"trainer.rollout_mode={cfg.trainer.rollout_mode}",
         cfg.trainer.rollout_mode != "sync"),
        ("a rollout worker group of its own", "actor_rollout_ref.hybrid_engine=false", not arr.hybrid_engine),
        ("a dataset class of your own", f"data.custom_cls.path={cfg.data.custom_cls.path}",
         bool(cfg.data.custom_cls.path)),
    ]
    return [(what, key) for what, key, on in features if on]


def vision_problems(cfg) -> list[str]:
    """Problems of a run whose actor_rollout_ref.model.path is a vision-language checkpoint; none for a text
    model (or a path that does not exist: the path checks report it)."""
    model_type = checkpoint_model_type(cfg.actor_rollout_ref.model.path)
    if model_type is None:
        return []
    if model_type not in SUPPORTED_MODEL_TYPES:
        return [f"actor_rollout_ref.model.path: verlx does not support the vision-language architecture "
                f"{model_type!r} yet; it trains {', '.join(SUPPORTED_MODEL_TYPES)}"]
    return [f"actor_rollout_ref.model.path is a vision-language model ({model_type}): verlx does not support {what} "
            f"with vision-language models yet ({key})" for what, key in _unsupported(cfg)]


def patch_size_findings(cfg) -> tuple[list[str], list[str]]:
    """(problems, warnings) of data.image_patch_size: veRL resizes images for it, verlx's image processor for the
    model's own patch size (config.json vision_config.patch_size; none for a text model, which has no images). That
    size or null passes; veRL's default 14, which its configs carry for every model (Qwen3-VL's 16-pixel patches
    too), is accepted with a warning; any other size is refused."""
    path = cfg.actor_rollout_ref.model.path
    asked, own = cfg.data.image_patch_size, checkpoint_patch_size(path)
    if own is None or asked in (None, own):
        return [], []
    if asked == VERL_DEFAULT_PATCH_SIZE:
        return [], [f"data.image_patch_size={asked} (veRL's default) is not the model's patch size: verlx resizes "
                    f"images for its vision encoder's {own}-pixel patches ({path}/config.json "
                    f"vision_config.patch_size), as its image processor does; set data.image_patch_size={own} or "
                    "remove it to silence this"]
    return [f"data.image_patch_size={asked}: the model's vision encoder uses {own}-pixel patches ({path}/config.json "
            f"vision_config.patch_size) and verlx resizes images with its image processor for those; set "
            f"data.image_patch_size={own} or remove it (resizing for another patch size is not supported)"], []
