"""The megatron backend's GPU checks on 2 GPUs, in order; a failed or timed-out step is recorded and the next runs.

  python benchmarks/megatron_gpu.py                          # every step (about 12 min: two device calls, below)
  python benchmarks/megatron_gpu.py --only parity grpo export --work /tmp/mgpu
  python benchmarks/megatron_gpu.py --only resume ppo_critic --work /tmp/mgpu   # the next call, machine still warm
  python benchmarks/megatron_gpu.py --smoke                  # CPU: the same pipeline with fsdp and the hf engine

Steps (the model is a Qwen2.5-0.5B shape with random weights, the data arithmetic prompts in the GSM8K schema):
  parity      `torchrun --nproc_per_node=2 benchmarks/megatron_parity.py`: TP=2 and PP=2 log-probs and one update
              against the FSDP actor (the FSDP parity table's tolerances; after the update, the bf16 noise floor
              measured against an fp32 FSDP run), and the exported checkpoint reloaded
  grpo        main_ppo --config-name ppo_megatron_trainer: GRPO, megatron TP=2 actor and reference (KL loss), SGLang
              TP=2 colocated, 3 steps, a checkpoint at step 3
  export      `python -m verlx.model_merger merge --backend megatron` of grpo's step-3 actor; the directory reloads
              with transformers, has the initial model's tensors, moved by training, and generates finite logits
  resume      main_ppo again to step 4: resumes grpo's checkpoint (model, distributed optimizer, lr schedule)
  ppo_critic  main_ppo PPO with GAE: megatron actor, reference and critic at PP=2, SGLang TP=2, 2 steps
  offload     grpo again (fresh, 3 steps, a checkpoint at step 3) with megatron.param_offload, grad_offload and
              optimizer_offload on (the reference's param_offload follows the actor's): per phase, the peak device
              memory of the trainer process (perf/max_memory_allocated_gb/<phase>) and the step time against grpo's
              step 3 (run grpo first in the same --work); expected drop in the generation phase: the actor's bf16
              params and grads, fp32 main params and Adam moments (2+2+4+8 bytes a parameter, over TP) plus the
              reference's bf16 params
  tp2pp2      (4 GPUs) main_ppo GRPO with the megatron actor and reference at TP=2 × PP=2, SGLang TP=2 (two engines),
              3 steps
Prints a summary table; $OUT/megatron_gpu.json keeps it, with each main_ppo run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from grpo_step_gpu import prepare_inputs  # noqa: E402  (the benchmark next to this one)

STEPS = ("parity", "grpo", "export", "resume", "ppo_critic", "offload", "tp2pp2")
# per step, so that each documented call (parity grpo export | resume ppo_critic) ends within a 600 s device call
TIMEOUT_S = {"parity": 200, "grpo": 300, "export": 90, "resume": 240, "ppo_critic": 330, "offload": 300,
             "tp2pp2": 300}


def run(cmd: list[str], log_path: str, timeout_s: float, env: dict | None = None) -> tuple[int, str]:
    """rc (124 on timeout) and the output, also echoed and kept in `log_path`."""
    with open(log_path, "w") as log:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                env=env).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    with open(log_path) as f:
        text = f.read()
    sys.stdout.write(text[-4000:])
    return rc, text


def ppo_command(args, work: str, name: str, steps: int, extra: list[str], gpus: int = 2) -> list[str]:
    model_dir, data_dir = os.path.join(work, "model"), os.path.join(work, "data")
    gpu = not args.smoke
    backend = (["--config-name", "ppo_megatron_trainer", f"actor_rollout_ref.rollout.name={args.engine}",
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={2 if args.engine == 'sglang' else 1}",
                "actor_rollout_ref.rollout.gpu_memory_utilization=0.4", f"trainer.n_gpus_per_node={gpus}"] if gpu else
               ["actor_rollout_ref.rollout.name=hf", "trainer.device=cpu", "trainer.n_gpus_per_node=1"])
    out = os.path.join(work, name)
    return [sys.executable, "-m", "verlx.trainer.main_ppo", *backend,
            f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
            f"data.train_batch_size={args.prompts}", "data.max_prompt_length=64",
            f"data.max_response_length={args.response_length}", f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.actor.optim.lr=1e-6", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
            f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.ignore_eos=true",
            f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.logger=[console,file]",
            f"trainer.output_dir={out}", f"trainer.default_local_dir={out}_ckpt",
            "trainer.progress_bar=false", "reward.num_workers=0",
            f"custom_reward_function.path={HERE}/varied_reward.py", *extra]


def metrics(work: str, name: str) -> list[dict]:
    path = os.path.join(work, name, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


def step_parity(args, work: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "benchmarks/megatron_parity.py", *(["--device", "cpu"] if args.smoke else [])]
    out = os.environ.get("OUT") or work
    rc, _ = run(cmd, os.path.join(work, "parity.log"), TIMEOUT_S["parity"], env={**os.environ, "OUT": out})
    result_path = os.path.join(out, "megatron_parity.json")
    checks = {}
    if os.path.exists(result_path):
        with open(result_path) as f:
            checks = json.load(f)["checks"]
    failed = [name for name, c in checks.items() if not c["ok"]]
    return {"ok": rc == 0 and bool(checks) and not failed, "rc": rc,
            "details": f"{len(checks) - len(failed)}/{len(checks)} checks ok" + (f", failed {failed}" if failed
                                                                                else ""), "checks": checks}


def grpo_command(args, work: str, steps: int) -> list[str]:
    megatron = [] if args.smoke else ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"]
    return ppo_command(args, work, "grpo", steps, ["algorithm.adv_estimator=grpo", "trainer.save_freq=3",
                                                   "actor_rollout_ref.actor.use_kl_loss=true", *megatron])


def step_grpo(args, work: str) -> dict:
    cmd = grpo_command(args, work, 3)
    rc, _ = run(cmd, os.path.join(work, "grpo.log"), TIMEOUT_S["grpo"])
    rows = metrics(work, "grpo")
    ok = rc == 0 and [r["step"] for r in rows] == [1, 2, 3] and os.path.isdir(f"{work}/grpo_ckpt/global_step_3")
    return {"ok": ok, "rc": rc, "rows": rows, "details": _row_details(rows)}


def step_export(args, work: str) -> dict:
    src, dst = f"{work}/grpo_ckpt/global_step_3/actor", f"{work}/exported"
    cmd = [sys.executable, "-m", "verlx.model_merger", "merge", "--local_dir", src, "--target_dir", dst]
    rc, _ = run(cmd, os.path.join(work, "export.log"), TIMEOUT_S["export"])
    if rc != 0:
        return {"ok": False, "rc": rc, "details": "model_merger failed"}
    return reload_check(dst, os.path.join(work, "model"))


def reload_check(exported: str, initial: str) -> dict:
    """The exported directory loads with transformers, holds the initial model's tensors (same names and shapes),
    changed by training, and its forward pass gives finite logits."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    new = AutoModelForCausalLM.from_pretrained(exported, dtype=torch.float32).to(device)
    old = AutoModelForCausalLM.from_pretrained(initial, dtype=torch.float32).to(device)
    new_params, old_params = dict(new.named_parameters()), dict(old.named_parameters())
    same_layout = {n: p.shape for n, p in new_params.items()} == {n: p.shape for n, p in old_params.items()}
    moved = max((new_params[n] - old_params[n]).abs().max().item() for n in old_params) if same_layout else 0.0
    with torch.no_grad():
        logits = new(torch.arange(1, 17, device=device)[None]).logits
    finite = bool(torch.isfinite(logits).all())
    return {"ok": same_layout and moved > 0 and finite, "rc": 0,
            "details": f"same tensors: {same_layout}, max |Δw| after training {moved:.3g}, finite logits: {finite}"}


def step_resume(args, work: str) -> dict:
    cmd = grpo_command(args, work, 4)
    rc, text = run(cmd, os.path.join(work, "resume.log"), TIMEOUT_S["resume"])
    rows = metrics(work, "grpo")
    resumed = "at step 3" in text and "resumed from" in text
    return {"ok": rc == 0 and resumed and rows[-1:] and rows[-1]["step"] == 4, "rc": rc,
            "details": f"resumed at step 3: {resumed}; " + _row_details(rows[-1:])}


def step_ppo_critic(args, work: str) -> dict:
    megatron = [] if args.smoke else ["actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]
    cmd = ppo_command(args, work, "ppo_critic", 2, ["algorithm.adv_estimator=gae", "critic.optim.lr=1e-5",
                                                   f"critic.ppo_mini_batch_size={args.prompts}", *megatron])
    rc, _ = run(cmd, os.path.join(work, "ppo_critic.log"), TIMEOUT_S["ppo_critic"])
    rows = metrics(work, "ppo_critic")
    ok = rc == 0 and len(rows) == 2 and all("critic/vf_loss" in r for r in rows)
    return {"ok": ok, "rc": rc, "rows": rows, "details": _row_details(rows, ("critic/vf_loss", "critic/grad_norm"))}


def step_offload(args, work: str) -> dict:
    megatron = [] if args.smoke else ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"] + [
        f"actor_rollout_ref.actor.megatron.{flag}=true" for flag in ("param_offload", "grad_offload",
                                                                      "optimizer_offload")]
    cmd = ppo_command(args, work, "offload", 3, ["algorithm.adv_estimator=grpo", "trainer.save_freq=3",
                                                 "actor_rollout_ref.actor.use_kl_loss=true", *megatron])
    rc, _ = run(cmd, os.path.join(work, "offload.log"), TIMEOUT_S["offload"])
    rows, baseline = metrics(work, "offload"), [r for r in metrics(work, "grpo") if r["step"] == 3]
    ok = rc == 0 and [r["step"] for r in rows] == [1, 2, 3] and os.path.isdir(f"{work}/offload_ckpt/global_step_3")
    memory = {}
    if rows and baseline:
        prefix = "perf/max_memory_allocated_gb/"
        memory = {key[len(prefix):]: {"resident": baseline[0][key], "offload": rows[-1][key]}
                  for key in rows[-1] if key.startswith(prefix) and key in baseline[0]}
        memory["step_s"] = {"resident": baseline[0].get("timing_s/step"), "offload": rows[-1].get("timing_s/step")}
    gen = memory.get("gen")
    ok = ok and (gen is None or gen["offload"] < gen["resident"])  # generation holds none of the offloaded state
    shown = ", ".join(f"{k} {v['resident']:.3g}→{v['offload']:.3g}" for k, v in memory.items()
                      if None not in v.values())
    return {"ok": ok, "rc": rc, "rows": rows, "memory": memory,
            "details": (f"step 3, resident→offload: {shown}" if memory else "no grpo step 3 to compare with") + "; "
            + _row_details(rows[-1:])}


def step_tp2pp2(args, work: str) -> dict:
    megatron = [] if args.smoke else ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                      "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"]
    extra = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.use_kl_loss=true", *megatron]
    cmd = ppo_command(args, work, "tp2pp2", 3, extra, gpus=4)
    rc, _ = run(cmd, os.path.join(work, "tp2pp2.log"), TIMEOUT_S["tp2pp2"])
    rows = metrics(work, "tp2pp2")
    return {"ok": rc == 0 and [r["step"] for r in rows] == [1, 2, 3], "rc": rc, "rows": rows,
            "details": _row_details(rows)}


def _row_details(rows: list[dict], keys=("actor/pg_loss", "actor/grad_norm")) -> str:
    shown = ("timing_s/step", *keys)
    return "; ".join(f"step {r['step']}: " + ", ".join(f"{k.split('/')[-1]} {r[k]:.3g}" for k in shown if k in r)
                     for r in rows)


def save_results(args, work: str, results: dict) -> None:
    """$OUT/megatron_gpu.json: the steps run so far, added to those of earlier invocations in the same $OUT."""
    if not os.environ.get("OUT"):
        return
    path = os.path.join(os.environ["OUT"], "megatron_gpu.json")
    earlier = {}
    if os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)["steps"]
    with open(path, "w") as f:
        json.dump({"args": vars(args), "work": work, "steps": {**earlier, **results}}, f, indent=1, default=str)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", choices=STEPS, default=[s for s in STEPS if s != "tp2pp2"],
                   help="steps to run (default: the 2-GPU ones; tp2pp2 needs 4 GPUs)")
    p.add_argument("--work", default=None, help="working directory (kept: later calls resume from it)")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--response-length", type=int, default=128)
    p.add_argument("--engine", default="sglang", help="rollout engine of the main_ppo steps (sglang: TP=2)")
    p.add_argument("--smoke", action="store_true", help="CPU: fsdp and the hf engine, tiny shape")
    args = p.parse_args()
    if args.smoke:
        args.prompts, args.n, args.response_length = 2, 2, 4
    work = args.work or tempfile.mkdtemp(prefix="verlx-megatron-gpu-")
    if not os.path.isdir(os.path.join(work, "model")):
        os.makedirs(work, exist_ok=True)
        prepare_inputs(work, "tiny" if args.smoke else "0.5b")
    results = {}
    for name in args.only:
        start = time.time()
        try:
            results[name] = globals()[f"step_{name}"](args, work)
        except Exception as e:  # a broken step is recorded; the next one still runs
            results[name] = {"ok": False, "rc": None, "details": f"{type(e).__name__}: {e}"}
        results[name]["seconds"] = time.time() - start
        print(f"STEP {name} ok={results[name]['ok']} {results[name]['seconds']:.0f}s {results[name]['details']}",
              flush=True)
        save_results(args, work, results)  # after every step: a call cut short keeps what finished
    print("\n| step | ok | seconds | details |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['ok']} | {r['seconds']:.0f} | {r['details']} |")
    return 0 if all(r["ok"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
