"""The `hf` engine: transformers `generate` on a full copy of the policy. Slow, simple, the correctness reference.

It also runs vision-language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): a request's images come as its vision inputs
(pixel_values, image_grid_thw), concatenated in row order for each `generate` call, with the image-token types
transformers needs for the M-RoPE positions."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from verlx.models.chunked_logprob import chunked_log_probs
from verlx.models.mrope import batch_position_ids
from verlx.models.vision import (
    IMAGE_GRID_THW,
    PIXEL_VALUES,
    VisionLanguageBody,
    causal_lm_class,
    prompt_image_mask,
    vision_language_model,
)
from verlx.rollout.base import RolloutContext, RolloutEngine, SamplingParams, mask_after_stop
from verlx.rollout.residency import WEIGHTS
from verlx.rollout.stream import ABORT, LENGTH, STOP, Finished, RequestStream, StreamLimits
from verlx.rollout.weight_sync import hf_param_name


class HFEngine(RolloutEngine):
    """Weights live on the device while awake and in CPU memory while asleep (like vLLM's sleep level 1). Its
    stream runs the requests waiting at a step as one `generate` call, to the end: nothing runs between steps, so
    there is nothing to pause (no partial rollout)."""

    name = "hf"
    supports_tensor_parallel = False
    supports_image_input = True

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        dtype = ctx.engine_dtype
        auto_class = causal_lm_class(ctx.hf_config)
        #: what the engine reads of a vision-language model (None: a text model)
        self.vision = vision_language_model(ctx.hf_config)
        if self.config.load_format == "dummy":
            model = auto_class.from_config(ctx.hf_config, dtype=dtype, trust_remote_code=ctx.trust_remote_code)
        else:
            model = auto_class.from_pretrained(ctx.model_path, dtype=dtype, trust_remote_code=ctx.trust_remote_code)
        self.model = model.to(ctx.device).eval()
        self.dtype = dtype
        self._params = dict(self.model.named_parameters(remove_duplicate=False))
        self.residency.weights_survive_release = True

    def _open_stream(self, params: SamplingParams, partial: bool) -> HFStream:
        return HFStream(self, params, self.stream_limits())

    def _release(self) -> None:
        if self.ctx.device.type == "cuda":
            self.model.to("cpu")
            torch.cuda.empty_cache()

    def _resume(self, tag: str) -> None:
        if tag == WEIGHTS:
            self.model.to(self.ctx.device)

    @torch.no_grad()
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        copied: set[int] = set()
        for name, tensor in named_tensors:
            name = hf_param_name(name)
            param = self._params.get(name)
            if param is None:
                raise KeyError(f"hf engine: no parameter named {name!r} in {type(self.model).__name__}")
            if param.shape != tensor.shape:
                raise ValueError(f"hf engine: {name} has shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
            param.copy_(tensor)
            copied.add(id(param))
        return {name for name, param in self.model.named_parameters() if id(param) not in copied}

    def _vision_kwargs(self, input_ids: torch.Tensor, visions: list[dict | None] | None) -> dict:
        """generate's vision inputs of these rows (their images in row order), none for text rows."""
        present = [v for v in (visions or []) if v]
        if not present:
            return {}
        if self.vision is None:
            raise ValueError(f"hf engine: the prompts have images, but {type(self.model).__name__} is not a "
                             "vision-language model")
        device = self.ctx.device
        return {PIXEL_VALUES: torch.cat([v[PIXEL_VALUES] for v in present]).to(device, self.dtype),
                IMAGE_GRID_THW: torch.cat([v[IMAGE_GRID_THW] for v in present]).to(device),
                "mm_token_type_ids": (input_ids == self.vision.image_token_id).int()}

    @torch.no_grad()
    def generate_rows(self, rows: list[list[int]], max_new_tokens: int, params: SamplingParams,
                      visions: list[dict | None] | None = None):
        """Left-padded rows → (responses [N, response_length] padded after the stop, response_mask, log-probs or
        None), by one transformers generate call (seeded with the generation's seed when it has one); `visions`:
        each row's vision inputs (None or empty without image)."""
        device, pad = self.ctx.device, self.ctx.pad_token_id
        width = max(int(self.config.prompt_length), max(len(r) for r in rows))
        input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r):] = torch.tensor(r)
            attention_mask[i, width - len(r):] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=params.min_new_tokens or None,
                      pad_token_id=pad, eos_token_id=None if params.ignore_eos else params.stop_token_ids,
                      use_cache=True)
        if params.greedy:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            kwargs.update(do_sample=True, temperature=params.temperature, top_p=params.top_p,
                          top_k=params.top_k if params.top_k > 0 else 0)
        vision = self._vision_kwargs(input_ids, visions)
        generated = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **vision,
                                        **kwargs)[:, width:]
        length = self.config.response_length
        if generated.shape[1] < length:
            fill = torch.full((generated.shape[0], length - generated.shape[1]), pad, dtype=generated.dtype,
                              device=device)
            generated = torch.cat([generated, fill], dim=1)
        stop_ids = [] if params.ignore_eos else params.stop_token_ids
        responses, response_mask = mask_after_stop(generated[:, :length], stop_ids, pad)
        log_probs = None
        if self.config.calculate_log_probs:
            log_probs = self._log_probs(input_ids, attention_mask, responses, response_mask, params, visions,
                                        vision)
        return responses.cpu(), response_mask.cpu(), None if log_probs is None else log_probs.cpu()

    def _log_probs(self, input_ids, attention_mask, responses, response_mask, params, visions, vision
                   ) -> torch.Tensor:
        """log softmax(logits / T) of the sampled tokens, by one forward over prompt + response (chunked)."""
        ids = torch.cat([input_ids, responses], dim=1)
        mask = torch.cat([attention_mask, response_mask.to(attention_mask.dtype)], dim=1)
        r = responses.shape[1]
        if self.vision is None:
            decoder, position_ids, extra = self.model.get_decoder(), (mask.cumsum(-1) - 1).clamp(min=0), {}
        else:  # the prompt's M-RoPE positions, continued through the response as text (as the rollout batch has them)
            grids = [v.get(IMAGE_GRID_THW) if v else None for v in (visions or [None] * len(ids))]
            prompt = batch_position_ids(input_ids.cpu(), attention_mask.cpu(), grids, self.vision.image_token_id,
                                        self.vision.merge_size)
            position_ids = torch.cat([prompt, prompt[..., -1:] + torch.arange(1, r + 1)], dim=-1).to(ids.device)
            decoder = VisionLanguageBody(self.model, self.vision, vision or None)
            extra = {"image_mask": prompt_image_mask(ids, r, self.vision)}
        hidden = decoder(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=False,
                         **extra).last_hidden_state
        temperature = params.temperature if params.temperature > 0 else 1.0
        weight = self.model.get_output_embeddings().weight
        log_probs, _ = chunked_log_probs(hidden[:, -r - 1:-1], weight, responses, temperature)
        return log_probs


class HFStream(RequestStream):
    """A step generates every waiting request (those of one budget together, in the order they came) to the end."""

    def __init__(self, engine: HFEngine, params: SamplingParams, limits: StreamLimits):
        super().__init__(params, limits, want_log_probs=bool(engine.config.calculate_log_probs))
        self.engine = engine
        self.waiting: list[tuple[str, list[int], int]] = []

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows) -> None:
        self.waiting.append((key, prompt_ids, max_new_tokens))

    def _step(self) -> list[Finished]:
        if not self.waiting:
            return []
        budget = self.waiting[0][2]
        batch = [w for w in self.waiting if w[2] == budget]
        self.waiting = [w for w in self.waiting if w[2] != budget]
        visions = [self.vision_inputs.get(key) for key, _, _ in batch]
        responses, mask, log_probs = self.engine.generate_rows([ids for _, ids, _ in batch], budget, self.params,
                                                               visions)
        lengths = mask.sum(-1).tolist()
        stop_ids = set() if self.params.ignore_eos else set(self.params.stop_token_ids)
        out = []
        for i, (key, _, _) in enumerate(batch):
            tokens = responses[i, : lengths[i]].tolist()
            lps = log_probs[i, : lengths[i]].tolist() if log_probs is not None else None
            out.append(Finished(key, tokens, lps, STOP if tokens and tokens[-1] in stop_ids else LENGTH))
        return out

    def _cancel(self, keys: set[str]) -> list[Finished]:
        cancelled = [w[0] for w in self.waiting if w[0] in keys]
        self.waiting = [w for w in self.waiting if w[0] not in keys]
        return [Finished(key, [], [] if self.want_log_probs else None, ABORT) for key in cancelled]
