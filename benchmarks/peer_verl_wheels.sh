#!/usr/bin/env bash
# Downloads veRL 0.9.1 and the pure-Python packages it imports that the GPU machine lacks, as wheels in
# .whl/peer_verl/ (about 10 MB: small enough to carry with a run), for benchmarks/peer_verl.py --wheels .whl/peer_verl.
#
#   bash benchmarks/peer_verl_wheels.sh                       # run from the project root, where pip can download
#   bash benchmarks/peer_verl_wheels.sh --with-transformers   # also transformers 5.10.4 (veRL pins <5.11)
#
# How the list was made (2026-11-24): `pip download verl==0.9.1 --no-deps` and its METADATA Requires-Dist, less
# what /work/.library/device/KINDS.md lists on the machine (accelerate, numpy, pandas, peft, pyarrow, pybind11,
# packaging, tensorboard, einops, psutil, cloudpickle, xxhash, fsspec, huggingface-hub, prometheus-client, ...),
# less what .device/ (ray, hydra-core, omegaconf) and the vLLM bundle (dill, msgspec, pyzmq, fastapi, uvicorn, ...)
# bring, plus those packages' own missing requirements:
#   verl 0.9.1            codetiming, datasets, pylatexenc, torchdata, tensordict (!=0.9.0, <=0.10.0), wandb (only
#                         imported for trainer.logger=wandb: left out), ray[default] (the .device Ray)
#   TransferQueue 0.1.11  the V1 trainer's data plane (verl[verl-core]; trainer.use_v1=true is veRL's default)
#   tensordict 0.10.0     pyvers, orjson, importlib_metadata (its C++ helper is built for torch 2.8: if it does not
#                         load under torch 2.11, tensordict falls back to Python, or the run shows the error)
#   datasets 4.4.1        multiprocess <0.70.19 (dill <0.4.1 is asked, the vLLM bundle has 0.4.1: installed without
#                         deps; check on the machine with the command below); pyarrow >= 21
# On the machine, before relying on it: python3 -m pip show pyarrow fsspec huggingface_hub transformers tokenizers
set -euo pipefail
out=.whl/peer_verl  # /.whl/ is in .gitignore
mkdir -p "$out"
plat=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" \
  verl==0.9.1 transferqueue==0.1.11 tensordict==0.10.0 pyvers==0.1.0 orjson importlib_metadata \
  torchdata==0.11.0 codetiming==1.4.0 datasets==4.4.1 multiprocess==0.70.18 pylatexenc==2.11
if [ "${1:-}" = "--with-transformers" ]; then
  python3 -m pip download -q --no-deps "${plat[@]}" -d "$out" transformers==5.10.4
fi
ls -la "$out" && du -sh "$out"
