"""What every engine from another package (SGLang, vLLM) shares: the install and release check, the sleep level, tied
embeddings, the memory budget, and the names a complete push must cover.

The concrete engines keep only what differs: how the engine is built and reached, its request stream, and the
calls for releasing and resuming memory and loading weights.
"""

from __future__ import annotations

from typing import ClassVar

from verlx.models.vision import vision_language_model
from verlx.rollout.base import RolloutContext, RolloutEngine
from verlx.rollout.engine_versions import check_engine_version, install_command
from verlx.rollout.memory_budget import check_budget, engine_footprint
from verlx.rollout.weight_sync import checkpoint_numel, engine_dtype, expected_push_names

SLEEP_LEVELS = (1, 2)


class ExternalEngine(RolloutEngine):
    """Base of the adapters for engines installed as their own package (`requires_package`)."""

    requires_package: ClassVar[str]

    @classmethod
    def install_command(cls) -> str:
        return install_command(cls.requires_package)

    @classmethod
    def check_install(cls) -> None:
        check_engine_version(cls.requires_package)

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        if self.config.sleep_level not in SLEEP_LEVELS:
            raise ValueError(f"actor_rollout_ref.rollout.sleep_level={self.config.sleep_level} must be one of "
                             f"{list(SLEEP_LEVELS)}")
        self.version = check_engine_version(self.requires_package)
        self.layout = ctx.layout
        self.tie_word_embeddings = bool(getattr(ctx.hf_config, "tie_word_embeddings", False))
        #: a vision-language model's image token and merge size (None for a text model): requests with images
        self.vision = vision_language_model(ctx.hf_config)
        #: a pushed parameter's name as the engine's loader takes it: a vision-language model's in its checkpoint's
        #: layout (Qwen2-VL's model.*, visual.*, where the trainer's transformers model names them
        #: model.language_model.*, model.visual.*); None: the HF name
        self.engine_weight_name = self.vision.checkpoint_weight_name if self.vision is not None else None
        #: the names a push must cover before a dummy-loaded (or discarded) engine may generate
        expected = expected_push_names(ctx.model_path, self.tie_word_embeddings)
        self.expected_names = (frozenset(map(self.engine_weight_name, expected))
                               if expected is not None and self.engine_weight_name else expected)
        if ctx.device.type == "cuda":
            self._check_memory_budget()

    def _check_memory_budget(self) -> None:
        """Refuse a gpu_memory_utilization that cannot hold this GPU's share of the weights (1 / tensor-parallel
        size) plus one sequence, before the engine allocates anything (unknown parameter counts, e.g. a checkpoint
        without safetensors, skip the check)."""
        import torch

        numel = checkpoint_numel(self.ctx.model_path)
        if numel is None:
            return
        dtype = engine_dtype(self.config.dtype)
        element = torch.empty((), dtype=dtype).element_size()
        sequence_len = self.config.max_model_len or self.config.prompt_length + self.config.response_length
        footprint = engine_footprint(self.ctx.hf_config, numel, element, self.layout.tp_size, sequence_len)
        total = torch.cuda.get_device_properties(self.ctx.device).total_memory
        check_budget(self.requires_package, self.config.gpu_memory_utilization, total, footprint)

    def _unset(self, pushed: set[str]) -> set[str]:
        """The checkpoint tensors a push did not send (none known when the checkpoint's names are not)."""
        return set(self.expected_names - pushed) if self.expected_names is not None else set()
