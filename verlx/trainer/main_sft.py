"""SFT entry point: `python -m verlx.trainer.main_sft key=value ...` (Hydra override grammar, sft_trainer.yaml).

Runs in this process alone (world size 1), or as one of `torchrun --nproc_per_node=N` processes.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.sft import SFTConfig
from verlx.trainer.preflight_sft import validate_sft
from verlx.utils.distributed import free_port
from verlx.utils.errors import reported_errors


def load_sft_config(overrides: Sequence[str] = ()) -> SFTConfig:
    """sft_trainer.yaml + overrides → SFTConfig; unknown keys fail with a did-you-mean."""
    return build(SFTConfig, to_container(load_yaml("sft_trainer", overrides, schema=SFTConfig)))


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
    from verlx.trainer.sft_trainer import SFTTrainer
    from verlx.utils.distributed import init_distributed

    _single_process_env()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    resolve_model_paths([("model.partial_pretrain", cfg.model, "partial_pretrain")])
    validate_sft(cfg, int(os.environ["WORLD_SIZE"]))
    _check_tokenizer_files(cfg)
    init_distributed()
    try:
        trainer = SFTTrainer(cfg, dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
        return trainer.fit()
    finally:
        dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> None:
    """Errors print their message alone (verlx.utils.errors): config and data errors exit with 2 (on every rank that
    finds them), a signal with 128 + its number."""
    with reported_errors():
        run_sft(load_sft_config(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
