"""benchmarks/verl_scripts.py on a checkout written here (a veRL-shaped tree: two launch scripts, a trainer module
with its @hydra.main, a script that launches no trainer): the scripts run under the recording shims, and each launch
is counted as passing or refused with its family. veRL's real checkouts are measured by hand (docs/verl_compat.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PASSING = """\
#!/usr/bin/env bash
set -x
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
python3 -m verl.trainer.main_ppo algorithm.adv_estimator=grpo data.train_files=$HOME/d/train.parquet \\
    data.train_batch_size=64 actor_rollout_ref.model.path=$MODEL actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.n=4 trainer.n_gpus_per_node=8 trainer.nnodes=1 $@
"""
REFUSED = """\
#!/usr/bin/env bash
NGPUS=$1
torchrun --nproc_per_node=$NGPUS -m verl.trainer.main_ppo data.train_files=$HOME/d/train.parquet \\
    algorithm.adv_estimator=grpo data.image_key=images actor_rollout_ref.model.path=Qwen/Qwen2.5-VL-3B-Instruct \\
    actor_rollout_ref.rollout.name=native trainer.n_gpus_per_node=$NGPUS
"""
NO_TRAINER = "#!/usr/bin/env bash\npython3 examples/data_preprocess/make_data.py --out $HOME/d\n"
TRAINER_MODULE = '@hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)\ndef main(c):\n' \
                 '    pass\n'


def write_checkout(root) -> None:
    files = {"examples/grpo/run_small.sh": PASSING, "examples/grpo/run_vision.sh": REFUSED,
             "examples/data_preprocess/prepare.sh": NO_TRAINER, "verl/trainer/main_ppo.py": TRAINER_MODULE,
             "verl/trainer/config/ppo_trainer.yaml": "data: {}\n", "recipe/README.md": "no recipes\n"}
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_benchmark_counts_a_checkouts_launches_and_names_the_refusal_family(tmp_path):
    write_checkout(tmp_path / "verl")
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "session.log").write_text("a running Ray's session\n")
    with open(tmp_path / "verl" / "examples/data_preprocess/prepare.sh", "a") as f:
        f.write(f"rm -rf {tmp_path}/keep/*\n")  # as a 2026-08 recipe does to /tmp/ray/*: recorded, not run
    before = sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs)
    proc = subprocess.run([sys.executable, "benchmarks/verl_scripts.py", "--verl-checkout", str(tmp_path / "verl"),
                           "--label", "synthetic"], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "1/2 compose and pass preflight (50%); 1 refused: 1 naming a missing feature, 0 refused by veRL too, " \
           "0 otherwise; 0 crashed; 1 scripts launch no trainer" in out, out
    family = "image input of the rollout engine (vision-language models on the native engine, or vLLM in server mode)"
    assert family in out.splitlines()[-1], out
    assert sorted(os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs) == before  # ran in a copy


def _running(pid: int) -> bool:
    """Alive and not a zombie (a container's first process may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_script_is_stopped_with_what_it_started_in_the_background(tmp_path):
    """A launch script that starts a server with `&` and exits leaves nothing running after the extraction."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from verl_scripts_extract import run_script

    script = tmp_path / "serve.sh"
    script.write_text(f"#!/usr/bin/env bash\n/bin/sleep 300 &\necho $! > {tmp_path}/pid\necho done >&2\n")
    (tmp_path / "shims").mkdir()
    start = time.monotonic()
    stderr = run_script(str(tmp_path), str(script), str(tmp_path), {}, [])
    assert time.monotonic() - start < 20
    pid = int((tmp_path / "pid").read_text())
    deadline = time.monotonic() + 10  # SIGKILL sent to the group; its delivery is not instantaneous on a loaded machine
    while _running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _running(pid)
    assert stderr == "done\n"  # at the script's exit, not at the 30 s limit the background process would reach
