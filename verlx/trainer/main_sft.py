"""SFT entry point: `python -m verlx.trainer.main_sft key=value ...` (Hydra override grammar, sft_trainer.yaml).

Runs in this process alone (world size 1), or as one of `torchrun --nproc_per_node=N` processes. veRL's SFT entry
points run the same trainer: verlx.trainer.fsdp_sft_trainer (fsdp_sft_trainer.yaml) and verlx.trainer.sft_trainer
(sft_trainer_engine.yaml), each with veRL's defaults and keys (docs/verl_compat.md).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.sft import SFTConfig
from verlx.trainer.entrypoint import hydra_command
from verlx.trainer.preflight_sft import validate_sft
from verlx.utils.distributed import free_port


def load_sft_config(overrides: Sequence[str] = (), config_name: str = "sft_trainer") -> SFTConfig:
    """sft_trainer.yaml (or `config_name`) + overrides → SFTConfig; unknown keys fail with a did-you-mean."""
    return build(SFTConfig, to_container(load_yaml(config_name, overrides, schema=SFTConfig)))


def _single_process_env() -> None:
    """Without a launcher this process is the whole world."""
    if "RANK" in os.environ:
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))


def _check_tokenizer_files(cfg: SFTConfig) -> None:
    """A model directory without a vocabulary is refused before any process group or device is touched."""
    from verlx.workers.tokenizer import tokenizer_files_problem

    if not cfg.model.trust_remote_code:
        problem = tokenizer_files_problem(cfg.model.partial_pretrain, "model.partial_pretrain")
        if problem is not None:
            raise ConfigError([problem])


def run_sft(cfg: SFTConfig) -> dict[str, float]:
    """Train, save, validate; returns the final metrics (the same on every rank)."""
    import torch.distributed as dist

    from verlx.config.hf_paths import resolve_model_paths
    from verlx.utils.distributed import init_distributed

    _single_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    resolve_model_paths([("model.partial_pretrain", cfg.model, "partial_pretrain")])
    validate_sft(cfg, int(os.environ["WORLD_SIZE"]))
    _check_tokenizer_files(cfg)
    init_distributed()
    try:
        return _train(cfg)
    finally:
        # FSDP modules sit in reference cycles that hold the process group: collected only at interpreter exit,
        # after destroy_process_group, gloo's threads abort the rank ("terminate called without an active
        # exception", SIGABRT) after a complete run
        gc.collect()
        dist.destroy_process_group()


def _train(cfg: SFTConfig) -> dict[str, float]:
    """The trainer lives in this frame only, so that nothing but its own reference cycles holds it afterwards."""
    import torch.distributed as dist

    from verlx.trainer.sft_trainer import SFTTrainer

    trainer = SFTTrainer(cfg, dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return trainer.fit()


def sft_command(config_name: str):
    """The `main()` of an SFT entry point composing `config_name` (Hydra flags, --cfg job, veRL's keys)."""
    return hydra_command(config_name, SFTConfig, run_sft)


main = sft_command("sft_trainer")

if __name__ == "__main__":
    main()
