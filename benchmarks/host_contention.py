"""verlx's GRPO step alone on GPU 0, then with a competing training job on GPU 1 of the same host: the slow-down.

One `main_ppo` run (grpo_step_gpu.py's model, data and settings) on GPU 0. After its warm-up steps and
`--alone-steps` steady steps, this script starts the competitor on GPU 1 — a plain torch training loop like a
neighbour's job: a DataLoader whose worker processes do host work per sample (string building, JSON round trips,
numpy arithmetic), pinned-memory batches copied to the GPU, forward/backward/AdamW of an MLP stack, and a loss
`.item()` every iteration. Steps that start after the competitor's loop runs are the contended ones. Printed and
written to $OUT/host_contention.json: the median step and phase seconds of both sets and their ratios (issue 26
item 5: ≤ 1.15× wanted; 1.53× measured before this script existed, with another training job on the second GPU).

  python benchmarks/host_contention.py                                  # 2 GPUs: verlx on 0, competitor on 1
  python benchmarks/host_contention.py --loader-workers 12 --extra actor_rollout_ref.actor.use_kl_loss=false
  python benchmarks/host_contention.py --device cpu --smoke             # CPU: the pipeline runs (a unit test)

One run for both sets keeps compilation, caches and the allocator's state out of the ratio: step 1 (compilation)
is never counted, and the competitor starts between two steps.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

PHASES = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/adv",
          "timing_s/update_actor", "timing_s/reward")


# ---------------------------------------------------------------------------------------------- the competitor
def competitor(args) -> None:
    """A neighbour's training job: host-heavy data loading feeding a GPU (or CPU) training loop, until killed.
    Starts up (CUDA context, model, loader processes), waits for `args.ready_file`.go, then trains and writes
    `args.ready_file` (its first iteration's end time)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    device = torch.device(args.competitor_device)
    width, rows = args.competitor_width, args.competitor_batch

    class HostHeavy(Dataset):
        def __len__(self):
            return 1 << 30

        def __getitem__(self, i):
            rng = np.random.default_rng(i)
            text = " ".join(f"token{j}" for j in rng.integers(0, 50_000, 256))  # a tokeniser-like string pass
            record = json.loads(json.dumps({"text": text, "ids": rng.integers(0, 50_000, 512).tolist()}))
            x = np.asarray(record["ids"], dtype=np.float32)[:width] if width <= 512 else rng.random(width)
            x = (x - x.mean()) / (x.std() + 1e-6)
            return torch.as_tensor(np.resize(x, width), dtype=torch.float32), torch.tensor(len(text) % 7)

    loader = DataLoader(HostHeavy(), batch_size=rows, num_workers=args.loader_workers,
                        pin_memory=device.type == "cuda", persistent_workers=args.loader_workers > 0)
    model = torch.nn.Sequential(*[m for _ in range(args.competitor_layers)
                                  for m in (torch.nn.Linear(width, width), torch.nn.GELU())],
                                torch.nn.Linear(width, 7)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batches = iter(loader)  # the loader's processes start now, so the go signal finds them running
    while not os.path.exists(args.ready_file + ".go"):
        time.sleep(0.05)
    for step, (x, y) in enumerate(batches):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()  # the per-iteration logging most loops do: a sync
        if args.competitor_pause_s:
            time.sleep(args.competitor_pause_s)
        if step == 0:
            with open(args.ready_file + ".tmp", "w") as f:
                f.write(str(time.time()))
            os.replace(args.ready_file + ".tmp", args.ready_file)


def start_competitor(args, work: str) -> tuple[subprocess.Popen, str]:
    ready = os.path.join(work, "competitor.ready")
    env = dict(os.environ)
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = str(args.competitor_gpu)
    cmd = [sys.executable, os.path.abspath(__file__), "--competitor", "--ready-file", ready,
           "--competitor-device", "cuda:0" if args.device == "cuda" else "cpu",
           "--loader-workers", str(args.loader_workers), "--competitor-width", str(args.competitor_width),
           "--competitor-layers", str(args.competitor_layers), "--competitor-batch", str(args.competitor_batch),
           "--competitor-pause-s", str(args.competitor_pause_s)]
    with open(ready + ".log", "w") as log:  # the child keeps its own handle
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    return proc, ready


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the loader's worker processes go too
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


# ---------------------------------------------------------------------------------------------- the verlx run
def read_rows(path: str) -> list[dict]:
    """The metrics file's complete lines (the last one may be half written while the trainer runs)."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except ValueError:
                break
    return rows


def run_verlx(args, cmd: list[str], env: dict, metrics: str, work: str) -> dict:
    """Run main_ppo beside the competitor, which starts up at once and starts training once `warmup +
    alone_steps` steps are logged. Returns the rows, when each row was seen (the end of its step), the
    competitor's first trained iteration's end and main_ppo's exit status."""
    comp, ready = start_competitor(args, work)
    seen: dict[int, float] = {}
    ready_at, verlx = None, None
    try:
        with open(os.path.join(work, "main_ppo.log"), "w") as log:
            verlx = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        while verlx.poll() is None:
            for row in read_rows(metrics):
                seen.setdefault(row["step"], time.time())
            if len(seen) >= args.warmup + args.alone_steps and not os.path.exists(ready + ".go"):
                open(ready + ".go", "w").close()
            if ready_at is None and os.path.exists(ready):
                with open(ready) as f:
                    ready_at = float(f.read())
            if comp.poll() is not None:
                raise RuntimeError(f"the competitor exited with {comp.returncode}; see {ready}.log")
            time.sleep(0.1)
        for row in read_rows(metrics):
            seen.setdefault(row["step"], time.time())
    finally:
        stop(comp)
        if verlx is not None and verlx.poll() is None:
            verlx.kill()
    return {"rows": read_rows(metrics), "seen": seen, "ready_at": ready_at, "rc": verlx.returncode}


def split_steps(rows: list[dict], seen: dict[int, float], ready_at: float | None, warmup: int):
    """(alone, contended) rows: after the warm-up, a step is contended when it started (the previous step was
    seen) after the competitor's loop ran, alone when it ended before the competitor was started."""
    alone, contended = [], []
    for row in rows:
        step = row["step"]
        if step <= warmup or step - 1 not in seen:
            continue
        if ready_at is not None and seen[step - 1] >= ready_at:
            contended.append(row)
        elif ready_at is None or seen[step] < ready_at:
            alone.append(row)
    return alone, contended


def summarise(alone: list[dict], contended: list[dict]) -> dict:
    out = {"alone_steps": [r["step"] for r in alone], "contended_steps": [r["step"] for r in contended],
           "phases": {}}
    for key in PHASES:
        a = [r[key] for r in alone if isinstance(r.get(key), (int, float))]
        c = [r[key] for r in contended if isinstance(r.get(key), (int, float))]
        if a and c:
            ma, mc = statistics.median(a), statistics.median(c)
            out["phases"][key] = {"alone_s": ma, "contended_s": mc, "ratio": mc / ma if ma > 0 else None}
    step = out["phases"].get("timing_s/step")
    out["step_ratio"] = step["ratio"] if step else None
    return out


def report(summary: dict) -> None:
    print(f"\nalone: steps {summary['alone_steps']}; with the competitor: steps {summary['contended_steps']}")
    print("| phase | alone s (median) | with competitor s | ratio |")
    print("|---|---|---|---|")
    for key, p in summary["phases"].items():
        ratio = f"{p['ratio']:.3f}" if p["ratio"] is not None else "-"
        print(f"| {key.split('/', 1)[1]} | {p['alone_s']:.4g} | {p['contended_s']:.4g} | {ratio} |")
    if summary["step_ratio"] is not None:
        print(f"\nstep slow-down with the competing job: {summary['step_ratio']:.3f}x (issue 26 target: <= 1.15x)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--smoke", action="store_true", help="the tiny shape, 1 + 1 + 1 steps, a small competitor")
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2, help="steps never counted (compilation, caches)")
    p.add_argument("--alone-steps", type=int, default=3)
    p.add_argument("--contended-steps", type=int, default=3)
    p.add_argument("--competitor-gpu", type=int, default=1)
    p.add_argument("--loader-workers", type=int, default=8, help="the competitor's DataLoader worker processes")
    p.add_argument("--competitor-width", type=int, default=4096)
    p.add_argument("--competitor-layers", type=int, default=8)
    p.add_argument("--competitor-batch", type=int, default=256)
    p.add_argument("--competitor-pause-s", type=float, default=0.0,
                   help="a pause after each of the competitor's iterations (the CPU smoke's competitor would "
                        "otherwise take a whole core of the machine its own run is tested on)")
    p.add_argument("--extra", nargs="*", default=[], help="more main_ppo overrides")
    p.add_argument("--competitor", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--competitor-device", default="cuda:0", help=argparse.SUPPRESS)
    p.add_argument("--ready-file", default="", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.prompts, args.n, args.response_length = "tiny", 2, 2, 4
        args.warmup, args.alone_steps, args.contended_steps = 1, 1, 1
        args.loader_workers, args.competitor_width, args.competitor_layers, args.competitor_batch = 1, 64, 2, 8
        args.competitor_pause_s = 0.05
    return args


def total_steps(args) -> int:
    """Warm-up, alone, one step during which the competitor starts (counted only if it started after its loop
    ran), contended."""
    return args.warmup + args.alone_steps + 1 + args.contended_steps


def verlx_command(args, model_dir: str, data_dir: str, out_dir: str) -> list[str]:
    from grpo_step_gpu import apply_smoke, verlx_overrides

    grpo = argparse.Namespace(prompts=args.prompts, n=args.n, gpus=1, response_length=args.response_length,
                              engine="native", steps=total_steps(args),
                              micro_batches="auto", ignore_eos=True, smoke=args.device == "cpu", extra=[])
    if args.smoke:
        apply_smoke(grpo)
        grpo.steps = total_steps(args)
    overrides = verlx_overrides(grpo, model_dir, data_dir, out_dir)
    overrides += ["trainer.test_freq=-1", "trainer.save_freq=-1", *args.extra]
    return [sys.executable, "-m", "verlx.trainer.main_ppo", *overrides]


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.competitor:
        competitor(args)
        return 0
    from grpo_step_gpu import prepare_inputs

    work = tempfile.mkdtemp(prefix="verlx-contention-")
    model_dir, data_dir = prepare_inputs(work, args.shape)
    out_dir = os.path.join(work, "out")
    env = dict(os.environ)
    if args.device == "cuda":
        env["CUDA_VISIBLE_DEVICES"] = "0"
    result = run_verlx(args, verlx_command(args, model_dir, data_dir, out_dir), env,
                       os.path.join(out_dir, "metrics.jsonl"), work)
    alone, contended = split_steps(result["rows"], result["seen"], result["ready_at"], args.warmup)
    summary = summarise(alone, contended)
    summary.update(rc=result["rc"], device=args.device, shape=args.shape, loader_workers=args.loader_workers,
                   competitor_started=result["ready_at"] is not None)
    report(summary)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "host_contention.json"), "w") as f:
            json.dump(summary, f, indent=1)
    if result["rc"] != 0:
        print(f"main_ppo exited with {result['rc']}; its log: {work}/main_ppo.log")
        return result["rc"]
    if not (alone and contended):
        print("no step ran both alone and with the competitor: raise --alone-steps / --contended-steps")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
