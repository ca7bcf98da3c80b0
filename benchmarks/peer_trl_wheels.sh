#!/usr/bin/env bash
# Downloads TRL 1.16 and the pure-Python packages it imports that the GPU machine lacks, as wheels in .whl/peer_trl/
# (about 5 MB: small enough to carry with a run), for benchmarks/peer_trl.py --wheels .whl/peer_trl.
#
#   bash benchmarks/peer_trl_wheels.sh     # run from the project root, where pip can download
#
# How the list was made (2026-11-28): `pip download trl==1.16.0 --no-deps` and its METADATA Requires-Dist (accelerate
# >= 1.10.1, datasets >= 4.7, transformers >= 4.56.2, ...), less what /work/.library/device/KINDS.md lists on the
# machine (accelerate 1.15.0, transformers 5.17, huggingface_hub 1.33 and its httpx, numpy, pandas, pyarrow, ...) and
# what the vLLM bundle brings (dill 0.4.1), plus those packages' own missing requirements:
#   datasets 4.8.4        pyarrow >= 21, dill < 0.4.2, huggingface-hub < 2 (the machine's 1.33), multiprocess < 0.70.20
#   multiprocess 0.70.18
set -euo pipefail
out=.whl/peer_trl  # /.whl/ is in .gitignore
mkdir -p "$out"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$out" \
  trl==1.16.0 datasets==4.8.4 multiprocess==0.70.18
ls -la "$out" && du -sh "$out"
