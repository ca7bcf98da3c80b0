"""Supervised fine-tuning on FSDP2: one process per device; Ulysses groups of consecutive processes share a data
shard of every global batch (model.ulysses_sequence_parallel_size), each group a data-parallel shard.

The loss is the mean NLL of all loss tokens of the global batch: each micro-batch contributes its summed NLL
divided by the batch's loss-token count (known on the host from the data, so no collective is needed), and FSDP's
gradient averaging is undone by the world size (each rank of a Ulysses group sums the NLL of the tokens its slice
predicts, so the group's gradients add up to its micro-batch's). One process and N processes therefore follow the
same loss curve for the same global batch. Rows are prompt + response pairs, or conversations (data.multiturn,
data/sft_conversations.py).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import math
import time

import numpy as np
import torch
import torch.distributed as dist

from verlx.config.sft import SFTConfig
from verlx.data.sft_conversations import ConversationKeys, tokenize_conversations
from verlx.data.sft_dataset import (
    TokenizedSFT,
    collate,
    collate_packed,
    read_parquet_rows,
    render_prompts,
    tokenize_sft,
)
from verlx.models.response_nll import ResponseNLL
from verlx.trainer.sft_batches import SFTLayout, plan_micro_batches
from verlx.trainer.sft_checkpoints import keep_newest, step_dir, write_atomically
from verlx.trainer.sft_eval import greedy_accuracy
from verlx.trainer.stop_signals import Interrupted, StopSignals, signal_name
from verlx.utils.cpu_threads import CpuThreads
from verlx.utils.device import resolve_device
from verlx.utils.lr_schedules import lr_multiplier
from verlx.utils.paths import expand_path
from verlx.utils.tracking import Tracking
from verlx.workers.tokenizer import stop_token_ids


def _dtype_kwarg(dtype: torch.dtype) -> dict:
    """transformers renamed `torch_dtype` to `dtype` in 4.56; pass whichever this version reads."""
    import transformers
    from packaging.version import Version

    return {"dtype": dtype} if Version(transformers.__version__) >= Version("4.56") else {"torch_dtype": dtype}


def checkpoint_dtype(model_path: str, trust_remote_code: bool = False) -> torch.dtype:
    """The dtype the checkpoint was saved in (config `dtype`, formerly `torch_dtype`); float32 when it names none."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


class EpochBatches:
    """Global batch `step` of a seeded per-epoch permutation (incomplete tail batches dropped)."""

    def __init__(self, num_rows: int, batch_size: int, seed: int, shuffle: bool):
        if num_rows < batch_size:
            raise ValueError(
                f"the training data has {num_rows} rows, fewer than data.train_batch_size={batch_size}; "
                f"lower the batch size or add data"
            )
        self.num_rows, self.batch_size, self.seed, self.shuffle = num_rows, batch_size, seed, shuffle
        self.steps_per_epoch = num_rows // batch_size
        self._epoch, self._order = -1, np.arange(num_rows)

    def __call__(self, step: int) -> np.ndarray:
        epoch, within = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch and self.shuffle:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
        self._epoch = epoch
        return self._order[within * self.batch_size : (within + 1) * self.batch_size]


def shard_model(model: ResponseNLL, device: torch.device, world_size: int) -> None:
    """FSDP2: one group per decoder layer plus the root (embeddings, final norm, lm_head); bf16 compute on GPU."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from verlx.models.policy import decoder_layers

    mesh = init_device_mesh(device.type, (world_size,))
    kwargs = {"mesh": mesh}
    if device.type == "cuda":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model.decoder()):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)


def _nothing_saved_at_stop() -> str:
    return "The model was not saved at the stop: an SFT run saves at trainer.save_freq steps and at the end."


def full_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded copies of every tensor (a collective: all ranks call it)."""
    from torch.distributed.tensor import DTensor

    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach() for k, v in module.state_dict().items()}


class SFTTrainer:
    def __init__(self, cfg: SFTConfig, rank: int, world_size: int, local_rank: int = 0):
        from verlx.models.ulysses import sequence_parallel_group
        from verlx.workers.tokenizer import checked_tokenizer

        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.device = resolve_device(cfg.trainer.device, local_rank)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.cpu_threads = CpuThreads() if self.device.type == "cpu" else None
        torch.manual_seed(cfg.trainer.seed)
        m, d = cfg.model, cfg.data
        self.layout = SFTLayout(rank, world_size, m.ulysses_sequence_parallel_size)
        self.sp_group = sequence_parallel_group(self.layout.sp_size)[0] if dist.is_initialized() else None
        self.model_path = expand_path(m.partial_pretrain, absolute=True)
        self.tokenizer = checked_tokenizer(self.model_path, m.trust_remote_code, "model.partial_pretrain")
        self.eos_ids = stop_token_ids(self.tokenizer, self.model_path, m.trust_remote_code)
        self.save_dtype = checkpoint_dtype(self.model_path, m.trust_remote_code)
        self.model = self._build_model()
        shard_model(self.model, self.device, world_size)

        self.train = self._tokenize(read_parquet_rows(d.train_files, d.train_max_samples, "data.train_files"))
        self.batches = EpochBatches(len(self.train), d.train_batch_size, cfg.trainer.seed, d.shuffle)
        t = cfg.trainer
        self.total_steps = t.total_training_steps or t.total_epochs * self.batches.steps_per_epoch
        self.val = self._load_val() if d.val_files else None

        o = cfg.optim
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad], lr=o.lr, betas=tuple(o.betas),
            weight_decay=o.weight_decay,
        )
        warmup = int(o.lr_warmup_steps_ratio * self.total_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(o.lr_scheduler, self.total_steps, warmup, o.min_lr_ratio)
        )
        self.metrics = Tracking(t.loggers if rank == 0 else [], t.project_name, t.experiment_name,
                                dataclasses.asdict(cfg), expand_path(t.output_dir))

    def _build_model(self) -> ResponseNLL:
        """The causal LM (with LoRA adapters when model.lora_rank > 0) wrapped for the loss."""
        from transformers import AutoModelForCausalLM

        m = self.cfg.model
        lm = AutoModelForCausalLM.from_pretrained(
            self.model_path,
            trust_remote_code=m.trust_remote_code,
            attn_implementation=m.attn_implementation,
            **_dtype_kwarg(torch.float32),
        )
        if m.enable_gradient_checkpointing:
            lm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        lm.config.use_cache = False
        if m.ulysses_sequence_parallel_size > 1:
            from verlx.models.ulysses import check_ulysses

            check_ulysses(lm.config, m.ulysses_sequence_parallel_size, self.world_size,
                          "model.ulysses_sequence_parallel_size")
        # a copy: building the model to save or validate sets its attention on the config, which the trained model
        # (packed attention) must not see
        self.lm_config = copy.deepcopy(lm.config)
        self.num_params = sum(p.numel() for p in lm.parameters())
        self.lora = m.lora_rank > 0 or m.lora_adapter_path is not None
        if self.lora:
            from verlx.models.lora import apply_lora

            lm = apply_lora(lm, m)
        return ResponseNLL(lm, packed=m.packed, sp_group=self.sp_group)

    def _tokenize(self, rows) -> TokenizedSFT:
        d = self.cfg.data
        if d.multiturn.enable:
            mt = d.multiturn
            keys = ConversationKeys(mt.messages_key, mt.tools_key, mt.enable_thinking_key, mt.enable_thinking_default)
            return tokenize_conversations(rows, self.tokenizer, keys, max_length=d.max_length,
                                          truncation=d.truncation, chat_kwargs=d.apply_chat_template_kwargs)
        return tokenize_sft(
            rows,
            self.tokenizer,
            prompt_key=d.prompt_key,
            response_key=d.response_key,
            end_of_response_id=self.eos_ids[0],
            max_length=d.max_length,
            truncation=d.truncation,
            chat_kwargs=d.apply_chat_template_kwargs,
        )

    def _load_val(self) -> dict:
        """Validation conversations (scored by their loss), or prompts and answers (scored by greedy accuracy)."""
        d = self.cfg.data
        rows = read_parquet_rows(d.val_files, d.val_max_samples, "data.val_files")
        if d.multiturn.enable:
            return {"conversations": self._tokenize(rows)}
        prompts = render_prompts(rows, self.tokenizer, d.prompt_key, d.apply_chat_template_kwargs)
        return {
            "prompt_ids": self.tokenizer(prompts, add_special_tokens=False)["input_ids"],
            "ground_truths": [str(v) for v in rows.column(d.ground_truth_key, "data.ground_truth_key")],
            "data_sources": (
                [str(v) for v in rows.column(d.reward_fn_key, "data.reward_fn_key")]
                if d.reward_fn_key in rows.table.column_names
                else ["unknown"] * len(rows)
            ),
        }

    def _print(self, message: str) -> None:
        if self.rank == 0:
            print(message, flush=True)

    def _micro_batches(self, data: TokenizedSFT, global_batch: np.ndarray) -> list[np.ndarray]:
        d = self.cfg.data
        budget = d.max_token_len_per_gpu * self.layout.sp_size if d.use_dynamic_bsz else None
        return plan_micro_batches(global_batch, data.lengths, self.layout, d.micro_batch_size_per_gpu, budget)

    def _nll(self, data: TokenizedSFT, rows: np.ndarray) -> torch.Tensor:
        """Summed NLL of the loss tokens of `rows` (with Ulysses, of those this rank's slice predicts)."""
        if self.cfg.model.packed:
            batch = collate_packed(data, rows, self.device, self.layout.sp_rank, self.layout.sp_size)
        else:
            batch = collate(data, rows, self.device)
        return self.model(**batch)

    def train_step(self, global_batch: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns this rank's share of the batch loss and the gradient norm (device tensors)."""
        data: TokenizedSFT = self.train
        response_tokens = max(int(data.response_lengths[global_batch].sum()), 1)
        scale = self.world_size / response_tokens
        loss = torch.zeros((), device=self.device)
        for rows in self._micro_batches(data, global_batch):
            nll = self._nll(data, rows)
            (nll * scale).backward()
            loss += nll.detach()
        clip = self.cfg.optim.clip_grad
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [p for p in self.model.parameters() if p.requires_grad], clip if clip and clip > 0 else float("inf")
        )
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss / response_tokens, grad_norm.detach()

    def _flush(self, step: int, losses: list, norms: list, lrs: list, tokens: int, seconds: float,
               start: float) -> dict:
        """Sum the ranks' loss shares of the interval's steps (one collective), check them, log their mean."""
        loss = torch.stack(losses)
        if self.world_size > 1:
            dist.all_reduce(loss)
        loss_values, norm_values = loss.tolist(), torch.stack(norms).tolist()
        if not all(math.isfinite(v) for v in loss_values + norm_values):
            raise FloatingPointError(
                f"non-finite loss or gradient norm by step {step} (loss {loss_values}, grad_norm {norm_values}); "
                f"lower optim.lr or set optim.clip_grad"
            )
        metrics = {
            "train/loss": float(np.mean(loss_values)),
            "train/loss_last": loss_values[-1],
            "train/grad_norm": float(np.mean(norm_values)),
            "train/lr": lrs[-1],
            "train/epoch": step / self.batches.steps_per_epoch,
            "perf/tokens_per_s": tokens / max(seconds, 1e-9),
            "timing_s/elapsed": time.perf_counter() - start,
        }
        if self.cpu_threads is not None:
            metrics["perf/cpu_threads"] = self.cpu_threads.threads
            self.cpu_threads.adjust()
        self.metrics.log(metrics, step)
        return metrics

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights under the HF model's names, unsharded (LoRA adapters merged in); a collective."""
        full = full_state_dict(self.model.lm)
        if not self.lora:
            return full
        from verlx.models.lora import lora_scaling, merged_weights

        return dict(merged_weights(full.items(), lora_scaling(self.model.lm)))

    @torch.no_grad()
    def validation_loss(self) -> dict[str, float]:
        """Mean NLL of the validation conversations' loss tokens (veRL's val/loss), batched like training."""
        data: TokenizedSFT = self.val["conversations"]
        self.model.eval()
        rows = np.arange(len(data) - len(data) % self.layout.dp_size)
        total = torch.zeros((), device=self.device)
        for part in self._micro_batches(data, rows):
            total += self._nll(data, part)
        if self.world_size > 1:
            dist.all_reduce(total)
        return {"val/loss": total.item() / max(int(data.response_lengths[rows].sum()), 1)}

    def validate(self, full: dict[str, torch.Tensor] | None = None):
        """val/loss of conversations, or greedy accuracy on the validation rows with an unsharded copy of the
        current weights."""
        from transformers import AutoModelForCausalLM

        if "conversations" in self.val:
            return self.validation_loss(), []
        full = full if full is not None else self.hf_state_dict()
        eval_dtype = torch.bfloat16 if self.device.type == "cuda" else torch.float32
        with torch.device(self.device):
            model = AutoModelForCausalLM.from_config(
                self.lm_config, trust_remote_code=self.cfg.model.trust_remote_code,
                attn_implementation=self.cfg.model.attn_implementation, **_dtype_kwarg(eval_dtype)
            )
        model.load_state_dict(full, strict=True)
        model.config.use_cache = True
        d = self.cfg.data
        metrics, examples = greedy_accuracy(
            model,
            self.tokenizer,
            self.val["prompt_ids"],
            self.val["ground_truths"],
            self.val["data_sources"],
            eos_ids=self.eos_ids,
            pad_id=self.train.pad_id,
            batch_size=d.val_batch_size,
            max_new_tokens=d.val_max_new_tokens,
            device=self.device,
            rank=self.rank,
            world_size=self.world_size,
        )
        return metrics, examples

    def save(self, full: dict[str, torch.Tensor], target: str | None = None) -> str:
        """save_pretrained (model in the checkpoint's dtype, tokenizer, generation config) into `target`
        (default_local_dir)."""
        from transformers import AutoModelForCausalLM, GenerationConfig

        target = expand_path(target or self.cfg.trainer.default_local_dir, absolute=True)
        if self.rank == 0:
            model = AutoModelForCausalLM.from_config(
                self.lm_config, trust_remote_code=self.cfg.model.trust_remote_code,
                attn_implementation=self.cfg.model.attn_implementation, **_dtype_kwarg(self.save_dtype)
            )
            model.load_state_dict(full, strict=True)
            model.config.use_cache = True
            with contextlib.suppress(OSError):  # a checkpoint without generation_config.json keeps the default
                model.generation_config = GenerationConfig.from_pretrained(self.model_path)

            def write(tmp: str) -> None:
                model.save_pretrained(tmp, safe_serialization=True)
                self.tokenizer.save_pretrained(tmp)

            write_atomically(target, write)
        if self.world_size > 1:
            dist.barrier()
        return target

    def save_step(self, step: int) -> None:
        """trainer.save_freq: the model at this step into global_step_<step>, then the oldest beyond
        max_ckpt_to_keep removed."""
        t = self.cfg.trainer
        target = self.save(self.hf_state_dict(), step_dir(expand_path(t.default_local_dir, absolute=True), step))
        if self.rank == 0:
            for path in keep_newest(t.default_local_dir, t.max_ckpt_to_keep):
                self._print(f"removed {path} (trainer.max_ckpt_to_keep={t.max_ckpt_to_keep})")
            self._print(f"saved step {step} to {target}")

    def _validate_reaches_target(self, step: int) -> bool:
        """Validate and log; whether trainer.target_val_accuracy is reached (training then stops)."""
        target = self.cfg.trainer.target_val_accuracy
        metrics, _ = self.validate()
        self.metrics.log(metrics, step)
        if target is None or metrics["val/accuracy"] < target:
            return False
        self._print(f"validation accuracy {metrics['val/accuracy']:.3f} reached trainer.target_val_accuracy={target} "
                    f"at step {step}: stopping")
        return True

    def fit(self) -> dict[str, float]:
        """Train, save, validate. A stop signal (trainer/stop_signals.py) ends training after the running step on
        every rank; the model trained so far is saved and Interrupted raised (exit 128 + the signal's number)."""
        t = self.cfg.trainer
        with StopSignals(t.save_on_signal, t.save_on_signal_timeout_s, _nothing_saved_at_stop) as stop:
            return self._fit(stop)

    def _stop_agreed(self, stop: StopSignals, sync_point: bool) -> int:
        """The stop signal received (0: none). With several ranks they agree at the steps that synchronise anyway
        (logging, validation: one all-reduce there), so that every rank stops after the same step."""
        if self.world_size == 1:
            return stop.signum or 0
        if not sync_point:
            return 0
        signum = torch.tensor([stop.signum or 0], device=self.device)
        dist.all_reduce(signum, op=dist.ReduceOp.MAX)
        return int(signum.item())

    def _fit(self, stop: StopSignals) -> dict[str, float]:
        t = self.cfg.trainer
        self._print(
            f"SFT: {self.num_params:,} parameters from {self.model_path} | {len(self.train)} rows, "
            f"{self.batches.steps_per_epoch} steps/epoch, {self.total_steps} steps of {self.cfg.data.train_batch_size} "
            f"| {self.world_size} process(es) on {self.device.type}"
            + (f", {self.cpu_threads.describe()}" if self.cpu_threads else "")
        )
        start = interval_start = time.perf_counter()
        losses, norms, lrs, tokens, final = [], [], [], 0, {}
        last_step, signum = self.total_steps, 0
        with stop.step_loop():
            for step in range(1, self.total_steps + 1):
                self.model.train()
                global_batch = self.batches(step - 1)
                lrs.append(self.scheduler.get_last_lr()[0])
                loss, grad_norm = self.train_step(global_batch)
                losses.append(loss)
                norms.append(grad_norm)
                tokens += int(self.train.lengths[global_batch].sum())
                validate_now = (self.val is not None and t.test_freq > 0 and step % t.test_freq == 0
                                and step != self.total_steps)
                log_now = step % t.log_freq == 0 or step == self.total_steps or validate_now
                signum = self._stop_agreed(stop, log_now) if t.save_on_signal else 0
                validate_now = validate_now and not signum
                if log_now or signum:
                    now = time.perf_counter()
                    final.update(self._flush(step, losses, norms, lrs, tokens, now - interval_start, start))
                    losses, norms, lrs, tokens = [], [], [], 0
                if signum or (validate_now and self._validate_reaches_target(step)):
                    last_step = step
                    break
                if t.save_freq > 0 and step % t.save_freq == 0:
                    self.save_step(step)
                if step % t.log_freq == 0 or validate_now:
                    interval_start = time.perf_counter()
            if t.save_freq > 0 and last_step % t.save_freq:
                self.save_step(last_step)  # veRL saves the last step too
            full = self.hf_state_dict()
            target = self.save(full)
        self._print(f"saved the fine-tuned model to {target}")
        if signum:
            self.metrics.finish()
            raise Interrupted(signum, f"stopped on {signal_name(signum)} after step {last_step} of {self.total_steps}: "
                              f"the model trained so far is saved in {target} (an SFT run does not resume: running "
                              "the command again starts from model.partial_pretrain)")
        if self.val is not None:
            metrics, examples = self.validate(full)
            for prompt, response, truth in examples:
                self._print(f"  {prompt!r} -> {response!r} (answer {truth})")
            final.update(metrics)
        final["timing_s/elapsed"] = time.perf_counter() - start
        final["train/steps"] = last_step
        self.metrics.log(final, last_step)
        self.metrics.finish()
        return final


if __name__ == "__main__":  # veRL 0.9.1's entry point: `python -m verlx.trainer.sft_trainer key=value ...`
    from verlx.trainer.main_sft import sft_command

    sft_command("sft_trainer_engine")()
