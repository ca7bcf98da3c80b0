"""RewardModelWorker: a sequence-classification reward model, FSDP-sharded in the trainer's colocated workers
(reward_model.enable); `compute_rm_score` gives each sample's score at its last response token (veRL's rm_scores)."""

from __future__ import annotations

import torch

from verlx.batch_columns import MODEL_INPUTS
from verlx.metrics.phases import phase_metrics
from verlx.models.hf_config import import_external_lib, load_hf_config
from verlx.protocol import DataProto
from verlx.single_controller import Dispatch, Worker, register
from verlx.utils.batch_sizes import dynamic_batches, per_gpu_micro_batch_size
from verlx.utils.distributed import init_distributed
from verlx.utils.dtypes import torch_dtype
from verlx.utils.paths import expand_path
from verlx.workers.fsdp.model_builder import apply_fsdp2, load_score_model
from verlx.workers.fsdp.offload import Offloader
from verlx.workers.memory_plan import EFFICIENT_MICRO_BATCH_TOKENS
from verlx.workers.micro_batching import micro_batches, restore_order, sequence_lengths
from verlx.workers.perf import training_phase_timer
from verlx.workers.reward_model_inputs import retemplated_inputs, scores_at_last_response_token
from verlx.workers.tokenizer import load_tokenizer

BUDGET_KEY = "reward_model.forward_max_token_len_per_gpu"


def reward_model_budget(config) -> int:
    """reward_model.forward_max_token_len_per_gpu, or (null) its longest input or EFFICIENT_MICRO_BATCH_TOKENS,
    whichever is more: a forward pass without gradients keeps one layer's activations at a time."""
    rm, data = config.reward_model, config.data
    if rm.forward_max_token_len_per_gpu is not None:
        return rm.forward_max_token_len_per_gpu
    return max(rm.max_length or data.max_prompt_length + data.max_response_length, EFFICIENT_MICRO_BATCH_TOKENS)


class RewardModelWorker(Worker):
    def __init__(self, config):
        super().__init__()
        self.config = config

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        cfg = self.config
        rm = cfg.reward_model
        init_distributed(timeout_s=cfg.actor_rollout_ref.nccl_timeout)
        path = expand_path(rm.model.path)
        import_external_lib(rm.model.external_lib)
        self.tokenizer = load_tokenizer(path, rm.model.trust_remote_code, key="reward_model.model.path")
        self.input_tokenizer = None
        if rm.model.input_tokenizer is not None:
            self.input_tokenizer = load_tokenizer(rm.model.input_tokenizer,
                                                  cfg.actor_rollout_ref.model.trust_remote_code,
                                                  key="reward_model.model.input_tokenizer")
        self.hf_config = load_hf_config(path, rm.model.trust_remote_code, rm.model.override_config)
        fsdp = rm.model.fsdp_config
        self.module = load_score_model(path, rm.model, torch_dtype(fsdp.model_dtype))
        self.module.requires_grad_(False)
        apply_fsdp2(self.module, self.device, torch_dtype(fsdp.dtype), fsdp.reshard_after_forward)
        self.offloader = Offloader.for_config("reward_model", self.module, None, self.device, fsdp.param_offload)
        self.offloader.offload()
        self.set_dispatch_info("reward", self.rank, self.world_size, True)
        micro = self._micro_batch_size()
        batching = (f"token budget {reward_model_budget(cfg)} per micro-batch"
                    if dynamic_batches(rm.use_dynamic_bsz, micro) else f"{micro} sequences per micro-batch")
        return {"settings": [f"reward model {path}: {batching}"]}

    def _micro_batch_size(self) -> int | None:
        rm = self.config.reward_model
        return per_gpu_micro_batch_size(rm.micro_batch_size_per_gpu, rm.micro_batch_size, self.world_size)

    def _inputs(self, data: DataProto) -> DataProto:
        if self.input_tokenizer is None:
            return data.select(list(MODEL_INPUTS), [], [])
        return retemplated_inputs(data, self.input_tokenizer, self.tokenizer, self.config.reward_model.max_length)

    @torch.no_grad()
    def _scores(self, inputs: DataProto) -> torch.Tensor:
        rm = self.config.reward_model
        parts, order = micro_batches(inputs, self._micro_batch_size(), rm.use_dynamic_bsz,
                                     reward_model_budget(self.config), key=BUDGET_KEY)
        self.module.eval()
        scores = torch.cat([self.module(**{k: p.batch[k].to(self.device, non_blocking=True) for k in MODEL_INPUTS})
                            for p in parts])
        return restore_order(scores, order.to(scores.device)) if order is not None else scores

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="reward")
    def compute_rm_score(self, data: DataProto) -> DataProto:
        inputs = self._inputs(data)
        timer = training_phase_timer(self.device, "reward_model", self.rank)
        with self.offloader.on_device(overlap=True), timer.measure():
            scores = self._scores(inputs)
        metrics = phase_metrics("reward_model", self.hf_config, sequence_lengths(inputs).tolist(), timer,
                                forward_only=True)
        return DataProto({"rm_scores": scores_at_last_response_token(data, scores)}, meta_info={"metrics": metrics})
