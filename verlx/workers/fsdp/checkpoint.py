"""Sharded checkpoints of an FSDP2 model and its optimizer (torch.distributed.checkpoint), plus per-rank extras.

The driver makes the step directory atomic (written under a temporary name and renamed once every rank is done);
this class writes the contents of one role's sub-directory.
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from verlx.models.lora import is_lora_model
from verlx.utils.seeding import rng_state, set_rng_state

logger = logging.getLogger(__name__)
HF_SUBDIR = "huggingface"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


class FSDPCheckpointManager:
    def __init__(self, module, optimizer, lr_scheduler, tokenizer=None, hf_config=None, strip_prefix: str = ""):
        self.module, self.optimizer, self.lr_scheduler = module, optimizer, lr_scheduler
        self.tokenizer, self.hf_config, self.strip_prefix = tokenizer, hf_config, strip_prefix

    def save(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, "dcp"))
        extra = {"lr_scheduler": self.lr_scheduler.state_dict() if self.lr_scheduler else None, "rng": rng_state(),
                 "world_size": _world()}
        torch.save(extra, os.path.join(path, f"extra_rank{_rank()}.pt"))
        if _rank() == 0 and self.hf_config is not None:
            hf_dir = os.path.join(path, HF_SUBDIR)
            self.hf_config.save_pretrained(hf_dir)
            if self.tokenizer is not None:
                self.tokenizer.save_pretrained(hf_dir)
            hf_model = getattr(self.module, "hf_model", None)
            if hf_model is not None and is_lora_model(hf_model):  # the merger rebuilds the adapters from this
                hf_model.peft_config["default"].save_pretrained(hf_dir)
        if dist.is_initialized():
            dist.barrier()

    def load(self, path: str) -> None:
        dcp_dir = os.path.join(path, "dcp")
        if not os.path.isdir(dcp_dir):
            raise FileNotFoundError(f"checkpoint {path} has no dcp/ directory (model and optimizer shards)")
        model_sd, optim_sd = get_state_dict(self.module, self.optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=dcp_dir)
        set_state_dict(self.module, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=True))
        extra_path = os.path.join(path, f"extra_rank{_rank()}.pt")
        if not os.path.exists(extra_path):
            # a different world size: the scheduler is the same on every rank; RNG streams cannot be recovered
            logger.warning("%s missing (checkpoint from another world size); using rank 0's scheduler state and "
                           "fresh RNG state for this rank", extra_path)
            extra_path = os.path.join(path, "extra_rank0.pt")
            extra = torch.load(extra_path, weights_only=False)
            extra.pop("rng", None)
        else:
            extra = torch.load(extra_path, weights_only=False)
        if self.lr_scheduler is not None and extra.get("lr_scheduler") is not None:
            self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        if "rng" in extra:
            set_rng_state(extra["rng"])
