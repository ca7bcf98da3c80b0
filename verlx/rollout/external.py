"""What every engine from another package (SGLang, vLLM) shares: the install and release check, the sleep level, the
residency state machine, tied embeddings, the names a complete push must cover, and the checks around generate.

The concrete engines keep only what differs: how the engine is built and reached, and the calls for generating,
releasing and resuming memory, and loading weights.
"""

from __future__ import annotations

import logging
from typing import ClassVar

from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext, RolloutEngine, SamplingParams, resolve_sampling
from verlx.rollout.engine_versions import check_engine_version, install_command
from verlx.rollout.memory_budget import EngineFootprint, check_budget, kv_bytes_per_token
from verlx.rollout.residency import EngineResidency
from verlx.rollout.weight_sync import checkpoint_numel, engine_dtype, expected_push_names

logger = logging.getLogger(__name__)
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
        #: the HF names a push must cover before a dummy-loaded (or discarded) engine may generate
        self.expected_names = expected_push_names(ctx.model_path, self.tie_word_embeddings)
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
        tp = self.layout.tp_size
        footprint = EngineFootprint(numel * element // tp, kv_bytes_per_token(self.ctx.hf_config, element, tp),
                                    sequence_len)
        total = torch.cuda.get_device_properties(self.ctx.device).total_memory
        check_budget(self.requires_package, self.config.gpu_memory_utilization, total, footprint)

    def _new_residency(self, weights_survive_release: bool) -> EngineResidency:
        """Weights are current at start unless the engine was built with random (dummy) weights."""
        return EngineResidency(self.requires_package, weights_current=not self.config.load_format.startswith("dummy"),
                               weights_survive_release=weights_survive_release)

    def _sampling_for(self, prompts: DataProto) -> SamplingParams:
        """The call's sampling parameters, after checking the engine may generate now."""
        self.residency.require_ready_to_generate()
        params = resolve_sampling(self.config, prompts.meta_info, self.ctx.eos_token_ids)
        if params.max_new_tokens > self.config.response_length:
            raise ValueError(
                f"max_new_tokens={params.max_new_tokens} exceeds actor_rollout_ref.rollout.response_length="
                f"{self.config.response_length}"
            )
        return params

    def _finish_push(self, pushed: set[str], unset_engine_params: set[str] = frozenset()) -> None:
        """Mark the push complete when it covered every checkpoint tensor (and every engine parameter the engine
        reports as not loaded is empty); a partial push into random or discarded weights is logged."""
        missing = sorted(self.expected_names - pushed) if self.expected_names is not None else []
        missing += sorted(unset_engine_params)
        if missing and not self.residency.weights_current:
            logger.warning("%s: the push left %d parameters unset (%s...); generate stays refused until a complete "
                           "push", self.requires_package, len(missing), missing[:4])
        self.residency.mark_pushed(complete=not missing)
