"""`python -m verlx.model_merger merge --local_dir .../global_step_N/actor --target_dir OUT`

Turns a sharded training checkpoint (FSDP2 via torch.distributed.checkpoint, or megatron dist-checkpointing) into a
standard HuggingFace directory (config, tokenizer, safetensors) that `from_pretrained` loads. The target directory is
written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys

import torch

from verlx.utils.dtypes import torch_dtype
from verlx.utils.errors import reported_errors
from verlx.utils.paths import expand_path

HF_SUBDIR = "huggingface"
FSDP_MODEL_PREFIX = "model.hf_model."


def detect_backend(local_dir: str) -> str:
    if os.path.exists(os.path.join(local_dir, "dcp", ".metadata")):
        from torch.distributed.checkpoint import FileSystemReader

        keys = FileSystemReader(os.path.join(local_dir, "dcp")).read_metadata().state_dict_metadata
        return "fsdp" if any(k.startswith(FSDP_MODEL_PREFIX) for k in keys) else "megatron"
    raise FileNotFoundError(
        f"{local_dir} holds no checkpoint shards (dcp/.metadata); point --local_dir at a global_step_N/actor directory"
    )


def merge_fsdp(local_dir: str, target_dir: str, dtype: torch.dtype | None) -> None:
    """Load the model entries of the DCP checkpoint into a freshly built HF model and save it."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    hf_dir = os.path.join(local_dir, HF_SUBDIR)
    if not os.path.isdir(hf_dir):
        raise FileNotFoundError(f"{local_dir} has no {HF_SUBDIR}/ (model config and tokenizer) directory")
    config = AutoConfig.from_pretrained(hf_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    lora = os.path.exists(os.path.join(hf_dir, "adapter_config.json"))
    if lora:  # a LoRA actor: rebuild the adapters, load them with the base weights, then merge
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig.from_pretrained(hf_dir))
    # the trainer saved {"model": PolicyModel state dict}: keys "hf_model.<name>", flattened as "model.hf_model..."
    wanted = {"model": {"hf_model." + k: v for k, v in model.state_dict().items()}}
    dcp.load(wanted, checkpoint_id=os.path.join(local_dir, "dcp"), no_dist=True)
    if lora:
        model = model.merge_and_unload()
    if dtype is not None:
        model.to(dtype)
    _save_atomically(target_dir, lambda tmp: (model.save_pretrained(tmp, safe_serialization=True),
                                              AutoTokenizer.from_pretrained(hf_dir).save_pretrained(tmp),
                                              _copy_generation_config(hf_dir, tmp)))


def _copy_generation_config(src: str, dst: str) -> None:
    path = os.path.join(src, "generation_config.json")
    if os.path.exists(path):
        shutil.copy(path, dst)


def _save_atomically(target_dir: str, write) -> None:
    target_dir = os.path.abspath(target_dir)
    tmp = f"{target_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        write(tmp)
        if os.path.exists(target_dir):
            shutil.rmtree(target_dir)
        os.rename(tmp, target_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def merge(local_dir: str, target_dir: str, backend: str = "auto", dtype: str | None = None) -> str:
    local_dir = expand_path(local_dir)
    backend = detect_backend(local_dir) if backend == "auto" else backend
    out_dtype = torch_dtype(dtype, "--dtype") if dtype else None
    if backend == "fsdp":
        merge_fsdp(local_dir, target_dir, out_dtype)
    elif backend == "megatron":
        from verlx.workers.megatron.checkpoint import export_megatron_checkpoint

        _save_atomically(target_dir, lambda tmp: export_megatron_checkpoint(local_dir, tmp, dtype=out_dtype))
    else:
        raise ValueError(f"--backend {backend!r}: use auto, fsdp or megatron")
    return target_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verlx.model_merger", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="write a HuggingFace model directory from a checkpoint")
    m.add_argument("--local_dir", required=True, help="a checkpoint's role directory, e.g. .../global_step_10/actor")
    m.add_argument("--target_dir", required=True, help="where the HF model directory goes")
    m.add_argument("--backend", default="auto", choices=["auto", "fsdp", "megatron"])
    m.add_argument("--dtype", default=None, help="save weights in this dtype (default: as trained, fp32 masters)")
    args = parser.parse_args(argv)
    try:
        out = merge(args.local_dir, args.target_dir, args.backend, args.dtype)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    with reported_errors():  # anything unexpected: a message, its traceback in a file (verlx.utils.errors)
        sys.exit(main())
