"""The `hf` engine: transformers `generate` on a full copy of the policy. Slow, simple, the correctness reference."""

from __future__ import annotations

import torch

from verlx.models.chunked_logprob import chunked_log_probs
from verlx.protocol import DataProto
from verlx.rollout.base import (
    RolloutContext,
    RolloutEngine,
    build_rollout_batch,
    mask_after_stop,
    resolve_sampling,
)
from verlx.rollout.weight_sync import hf_param_name


class HFEngine(RolloutEngine):
    """Weights live on the device while awake and in CPU memory while asleep (like vLLM's sleep level 1)."""

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        from transformers import AutoModelForCausalLM

        dtype = ctx.engine_dtype
        if self.config.load_format == "dummy":
            model = AutoModelForCausalLM.from_config(ctx.hf_config, dtype=dtype,
                                                     trust_remote_code=ctx.trust_remote_code)
        else:
            model = AutoModelForCausalLM.from_pretrained(ctx.model_path, dtype=dtype,
                                                         trust_remote_code=ctx.trust_remote_code)
        self.model = model.to(ctx.device).eval()
        self.dtype = dtype
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self._awake = True

    @torch.no_grad()
    def generate(self, prompts: DataProto) -> DataProto:
        if not self._awake:
            raise RuntimeError("hf engine: generate called while asleep; call wake_up() first")
        params = resolve_sampling(self.config, prompts.meta_info, self.ctx.eos_token_ids)
        device = self.ctx.device
        input_ids = prompts.batch["input_ids"].to(device)
        attention_mask = prompts.batch["attention_mask"].to(device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        kwargs = dict(
            max_new_tokens=params.max_new_tokens,
            min_new_tokens=params.min_new_tokens or None,
            num_return_sequences=params.n,
            pad_token_id=self.ctx.pad_token_id,
            eos_token_id=None if params.ignore_eos else params.stop_token_ids,
            use_cache=True,
        )
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k if params.top_k > 0 else 0)
        out = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        generated = out[:, input_ids.shape[1]:]
        length = self.config.response_length
        if generated.shape[1] < length:
            pad = torch.full((generated.shape[0], length - generated.shape[1]), self.ctx.pad_token_id,
                             dtype=generated.dtype, device=device)
            generated = torch.cat([generated, pad], dim=1)
        generated = generated[:, :length]
        stop_ids = [] if params.ignore_eos else params.stop_token_ids
        responses, response_mask = mask_after_stop(generated, stop_ids, self.ctx.pad_token_id)
        log_probs = None
        if self.config.calculate_log_probs:
            log_probs = self._log_probs(input_ids, attention_mask, responses, response_mask, params)
        return build_rollout_batch(prompts, responses.cpu(), response_mask.cpu(),
                                   None if log_probs is None else log_probs.cpu(), params.n)

    def _log_probs(self, input_ids, attention_mask, responses, response_mask, params) -> torch.Tensor:
        """log softmax(logits / T) of the sampled tokens, by one forward over prompt + response (chunked)."""
        n = params.n
        prompt_ids = input_ids.repeat_interleave(n, dim=0)
        prompt_mask = attention_mask.repeat_interleave(n, dim=0)
        ids = torch.cat([prompt_ids, responses], dim=1)
        mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = self.model.get_decoder()(input_ids=ids, attention_mask=mask, position_ids=position_ids,
                                          use_cache=False).last_hidden_state
        r = responses.shape[1]
        temperature = params.temperature if params.temperature > 0 else 1.0
        weight = self.model.get_output_embeddings().weight
        log_probs, _ = chunked_log_probs(hidden[:, -r - 1:-1], weight, responses, temperature)
        return log_probs

    def sleep(self) -> None:
        if self.ctx.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        self._awake = False

    def wake_up(self, tags=("weights", "kv_cache")) -> None:
        if "weights" in tags:
            self.model.to(self.ctx.device)
            self._awake = True

    @torch.no_grad()
    def update_weights(self, named_tensors) -> None:
        for name, tensor in named_tensors:
            name = hf_param_name(name)
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"hf engine: no parameter named {name!r} in {type(self.model).__name__}")
            if param.shape != tensor.shape:
                raise ValueError(f"hf engine: {name} has shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
            param.copy_(tensor)
