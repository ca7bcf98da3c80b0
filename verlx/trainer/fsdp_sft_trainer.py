"""`python -m verlx.trainer.fsdp_sft_trainer key=value ...`: veRL's fsdp_sft_trainer command line (its keys and
defaults, fsdp_sft_trainer.yaml) on verlx's SFT trainer (verlx.trainer.main_sft)."""

from __future__ import annotations

from verlx.trainer.main_sft import sft_command

main = sft_command("fsdp_sft_trainer")

if __name__ == "__main__":
    main()
