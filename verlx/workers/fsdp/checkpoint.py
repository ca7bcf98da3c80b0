"""Sharded checkpoints of an FSDP2 model and its optimizer (torch.distributed.checkpoint), plus per-rank extras.

The driver makes the step directory atomic (written under a temporary name and renamed once every rank is done);
this class writes the contents of one role's sub-directory.
"""

from __future__ import annotations

import os

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from verlx.models.lora import is_lora_model
from verlx.workers.checkpoint_state import (
    load_rank_state,
    optimizer_settings,
    restore_optimizer_settings,
    save_hf_metadata,
    save_rank_state,
)


class FSDPCheckpointManager:
    def __init__(self, module, optimizer, lr_scheduler, tokenizer=None, hf_config=None, strip_prefix: str = ""):
        self.module, self.optimizer, self.lr_scheduler = module, optimizer, lr_scheduler
        self.tokenizer, self.hf_config, self.strip_prefix = tokenizer, hf_config, strip_prefix

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, "dcp"))
        save_rank_state(path, self.lr_scheduler)
        hf_dir = save_hf_metadata(path, self.hf_config, self.tokenizer)
        hf_model = getattr(self.module, "hf_model", None)
        if hf_dir is not None and hf_model is not None and is_lora_model(hf_model):  # the merger rebuilds adapters
            hf_model.peft_config["default"].save_pretrained(hf_dir)
        if dist.is_initialized():
            dist.barrier()

    def load(self, path: str) -> None:
        dcp_dir = os.path.join(path, "dcp")
        if not os.path.isdir(dcp_dir):
            raise FileNotFoundError(f"checkpoint {path} has no dcp/ directory (model and optimizer shards)")
        settings = optimizer_settings(self.optimizer)
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=dcp_dir)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=True))
        restore_optimizer_settings(self.optimizer, settings)
        load_rank_state(path, self.lr_scheduler)
