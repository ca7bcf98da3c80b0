"""Vision-language policies (Qwen2-VL, Qwen2.5-VL, Qwen3-VL): which checkpoints are ones, their image token, and the
forward pass that puts the vision tower's image features into the text sequence.

A vision-language batch row carries its vision inputs in the non-tensor column `multi_modal_inputs`
(verlx.batch_columns): a dict with `pixel_values` [patches, C * t * p * p] and `image_grid_thw` [images, 3] (an
empty dict for a row without image). A micro-batch's rows are concatenated in row order (`micro_batch_vision`),
which is also the order of their image tokens in the batch, padded or packed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verlx.models.checkpoint_config import read_checkpoint_config
from verlx.models.mrope import MROPE_AXES, image_token_counts

PIXEL_VALUES = "pixel_values"
IMAGE_GRID_THW = "image_grid_thw"


@dataclass(frozen=True)
class VisionArchitecture:
    """What differs between the vision-language architectures verlx trains; their image tokens, image processor
    outputs and M-RoPE positions for images are Qwen2-VL's in all of them."""

    #: transformers 5's parameter-name prefixes → the checkpoint's (which the engines' loaders read), first match
    checkpoint_prefixes: tuple[tuple[str, str], ...]
    #: the vision tower also returns features of some of its blocks, added to the first decoder layers' hidden
    #: states at the image tokens (Qwen3-VL's DeepStack)
    deepstack: bool


#: transformers 5 names a Qwen2-VL / Qwen2.5-VL model's parts model.language_model.* and model.visual.*; their
#: checkpoints (transformers 5 converts back when it saves) name them model.* and visual.*
_QWEN2_VL_CHECKPOINT = (("model.language_model.", "model."), ("model.visual.", "visual."))
#: model_type → the vision-language architectures verlx trains; Qwen3-VL's checkpoints keep transformers 5's names
ARCHITECTURES = {
    "qwen2_vl": VisionArchitecture(_QWEN2_VL_CHECKPOINT, deepstack=False),
    "qwen2_5_vl": VisionArchitecture(_QWEN2_VL_CHECKPOINT, deepstack=False),
    "qwen3_vl": VisionArchitecture((), deepstack=True),
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)


@dataclass(frozen=True)
class VisionLanguageModel:
    """What verlx reads of a vision-language checkpoint's config. The defaults of `architecture` are Qwen2-VL's, for
    a model known from its processor alone (RLHFDataset's `processor`: the data path reads only its tokens)."""

    model_type: str
    image_token_id: int
    merge_size: int  # image patches merged per token along each side
    architecture: VisionArchitecture = ARCHITECTURES["qwen2_vl"]

    def checkpoint_weight_name(self, name: str) -> str:
        """A policy parameter's name as the checkpoint stores it (lm_head and checkpoint names are unchanged)."""
        return renamed_by_prefix(name, self.architecture.checkpoint_prefixes)


def renamed_by_prefix(name: str, prefixes: tuple[tuple[str, str], ...]) -> str:
    """`name` with the first of `prefixes` (old, new) it starts with replaced; unchanged when none matches."""
    for old, new in prefixes:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def vision_language_model(hf_config, key: str = "actor_rollout_ref.model.path") -> VisionLanguageModel | None:
    """The vision-language description of an HF config; None for a text model. Raises for a vision-language
    architecture verlx does not train (naming `key`)."""
    if getattr(hf_config, "vision_config", None) is None:
        return None
    model_type = getattr(hf_config, "model_type", "?")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"{key}: the vision-language architecture {model_type!r} is not supported yet; verlx trains "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} (video and audio inputs are not supported either)")
    return VisionLanguageModel(model_type, int(hf_config.image_token_id),
                               int(hf_config.vision_config.spatial_merge_size), ARCHITECTURES[model_type])


def checkpoint_model_type(path: str | None) -> str | None:
    """The model_type of a vision-language checkpoint directory (its config.json has a vision_config), None for a
    text model or a directory whose config cannot be read (the path checks report that). Reads the file only."""
    raw = read_checkpoint_config(path)
    return str(raw.get("model_type", "?")) if raw and raw.get("vision_config") else None


def checkpoint_patch_size(path: str | None) -> int | None:
    """The vision encoder's patch size of a vision-language checkpoint (config.json vision_config.patch_size), None
    where the file or the field is missing. Reads the file only."""
    vision = (read_checkpoint_config(path) or {}).get("vision_config") or {}
    size = vision.get("patch_size")
    return int(size) if isinstance(size, int) else None


def prompt_image_mask(input_ids: torch.Tensor, response_length: int, spec: VisionLanguageModel) -> torch.Tensor:
    """[B, P + R] true at the prompt's image tokens. The response's are text: a policy may sample the image token
    (transformers' generate and the rollout engines embed it as text), and it has no image behind it."""
    mask = input_ids == spec.image_token_id
    mask[:, input_ids.shape[1] - response_length:] = False
    return mask


def micro_batch_vision(rows: np.ndarray | None, input_ids: torch.Tensor, spec: VisionLanguageModel,
                       response_length: int = 0) -> dict[str, torch.Tensor] | None:
    """The vision inputs of a micro-batch's rows (their `multi_modal_inputs`), concatenated in row order; None
    when no row has an image. Checked on the host against the image tokens of the prompts of `input_ids` (a host
    tensor, [B, P + response_length]), so a row whose images and tokens disagree fails here, not as a shape error
    inside the model."""
    present = [row for row in (rows if rows is not None else []) if row and PIXEL_VALUES in row]
    tokens = int((input_ids[:, :input_ids.shape[1] - response_length] == spec.image_token_id).sum())
    if not present:
        if tokens:
            raise ValueError(f"the micro-batch has {tokens} image tokens but no pixel_values (the batch column "
                             "multi_modal_inputs is missing or empty)")
        return None
    grids = torch.cat([row[IMAGE_GRID_THW] for row in present])
    expected = int(image_token_counts(grids, spec.merge_size).sum())
    if tokens != expected:
        raise ValueError(f"the micro-batch has {tokens} image tokens, but its images' grids make {expected}")
    return {PIXEL_VALUES: torch.cat([row[PIXEL_VALUES] for row in present]), IMAGE_GRID_THW: grids}


class VisionLanguageBody:
    """The decoder of a vision-language model as `PolicyModel` calls a text decoder: (input_ids, attention_mask,
    position_ids [B, 4, T], **attention kwargs) → hidden states, with the images of `vision` scattered into the
    embeddings of the image tokens. The vision tower runs on its own, so the text's packed-attention kwargs never
    reach it."""

    def __init__(self, hf_model, spec: VisionLanguageModel, vision: dict[str, torch.Tensor] | None):
        self.body = hf_model.model
        self.spec = spec
        self.vision = vision

    def __call__(self, input_ids, attention_mask, position_ids, use_cache: bool = False,
                 image_mask: torch.Tensor | None = None, **attention_kwargs) -> Any:
        """`image_mask`: the tokens that take the image features, in order (default: every image token)."""
        embeds = self.body.get_input_embeddings()(input_ids)
        deepstack = {}
        if self.vision is not None:
            out = self.body.get_image_features(self.vision[PIXEL_VALUES], self.vision[IMAGE_GRID_THW],
                                               return_dict=True)
            mask = input_ids == self.spec.image_token_id if image_mask is None else image_mask
            embeds = embeds.masked_scatter(mask.unsqueeze(-1), torch.cat(out.pooler_output).to(embeds.dtype))
            if self.spec.architecture.deepstack:  # the same tokens take each listed block's features too
                deepstack = {"visual_pos_masks": mask,
                             "deepstack_visual_embeds": [_joined(f) for f in out.deepstack_features]}
        mrope = position_ids[:, MROPE_AXES].transpose(0, 1)  # [3, B, T], the layout the text model takes
        return self.body.language_model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=mrope,
                                        use_cache=use_cache, **deepstack, **attention_kwargs)


def _joined(features) -> torch.Tensor:
    """One block's DeepStack features of all images: transformers 5.24 splits them per image, 5.17 (the GPU
    machine's, 2026-11-27) returns them joined."""
    return torch.cat(features) if isinstance(features, (list, tuple)) else features


def causal_lm_class(hf_config):
    """The transformers auto class a policy of this config loads with: image-text-to-text for a vision-language
    model, causal LM otherwise."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if vision_language_model(hf_config) is not None else AutoModelForCausalLM


def vision_tower(hf_model) -> torch.nn.Module:
    """The image encoder (patch embedding, blocks and merger) of a vision-language model."""
    return hf_model.model.visual
