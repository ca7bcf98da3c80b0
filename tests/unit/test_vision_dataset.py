"""RLHFDataset with a vision-language model's processor (tiny Qwen2-VL; Qwen3-VL's patch size) on real parquet files
in veRL's geo3k format: images as [{"bytes": png}] or paths, one `<image>` placeholder per image in the prompt
text."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoTokenizer

from helpers.tiny_tokenizer import build_tiny_tokenizer
from helpers.tiny_vlm import image_tokens, png_bytes, random_image, save_tiny_vlm
from verlx.batch_columns import MULTI_MODAL_INPUTS
from verlx.config.loader import DataError
from verlx.config.run import DataConfig
from verlx.data import RLHFDataset, write_parquet_atomic
from verlx.data.vision_prompts import load_image_prompts

# "<|im_start|>user\n" (1 + 5) + content + "<|im_end|>\n<|im_start|>assistant\n" (1 + 1 + 1 + 10)
TEMPLATE_TOKENS = 19


def geo_row(text: str, images: list, i: int = 0) -> dict:
    return {"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": text}], "images": images,
            "ability": "math", "reward_model": {"style": "rule", "ground_truth": "3"}, "extra_info": {"index": i}}


@pytest.fixture(scope="module")
def vl_model(tmp_path_factory):
    path = save_tiny_vlm(tmp_path_factory.mktemp("tiny_vl"))
    return path, AutoTokenizer.from_pretrained(path), load_image_prompts(path, AutoConfig.from_pretrained(path))


def test_rows_carry_image_tokens_pixels_and_mrope_positions(tmp_path, vl_model):
    path, tokenizer, prompts = vl_model
    image_path = tmp_path / "b.png"
    random_image(28, 56, seed=2).save(image_path)
    rows = [geo_row("<image>Find x.", [{"bytes": png_bytes(random_image(56, 84, seed=1)), "path": None}]),
            geo_row("Compare <image> and <image>", [{"bytes": None, "path": str(image_path)},
                                                      {"bytes": png_bytes(random_image(28, 28, 3)), "path": None}],
                    i=1),
            geo_row("No picture.", [], i=2)]
    file = write_parquet_atomic(rows, tmp_path / "geo.parquet")
    ds = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=64), processor=prompts)
    image = prompts.model.image_token_id
    counts = [[image_tokens(56, 84)], [image_tokens(28, 56), image_tokens(28, 28)], []]
    assert counts == [[6], [2, 1], []]
    texts = ["Find x.", "Compare  and ", "No picture."]
    assert ds.prompt_lengths.tolist() == [TEMPLATE_TOKENS + len(t) + 3 * len(c) - len(c) + sum(c)
                                          for t, c in zip(texts, counts)]
    batch = ds.get_batch([0, 1, 2])
    ids, mask = batch.batch["input_ids"], batch.batch["attention_mask"]
    vision = batch.non_tensor_batch[MULTI_MODAL_INPUTS]
    assert "images" not in batch.non_tensor_batch
    for row in range(3):
        grids = vision[row].get("image_grid_thw", torch.zeros((0, 3), dtype=torch.long))
        per_image = (grids.prod(-1) // 4).tolist()
        assert per_image == counts[row]
        assert int((ids[row] == image).sum()) == sum(per_image)
        if per_image:
            assert vision[row]["pixel_values"].shape[0] == int(grids.prod(-1).sum())
        else:
            assert vision[row] == {}
    # row 1: "<|im_start|>user\nCompare <|vision_start|> 2 x image <|vision_end|> and <|vision_start|> image ..."
    start, end = (tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>"))
    real = ids[1][mask[1].bool()].tolist()
    first = real.index(start)
    assert real[first + 1:first + 4] == [image, image, end]
    positions = batch.batch["position_ids"]
    assert positions.shape == (3, 4, 64)
    assert positions[2, :, mask[2].bool()].tolist() == [list(range(int(mask[2].sum())))] * 4
    # row 0: an image of merged grid 2 x 3 after "<|im_start|>user\n<|vision_start|>" (7 tokens): rows 7, 7, 7, 8,
    # 8, 8 and columns 7, 8, 9 twice; the text after it resumes at 7 + max(2, 3) = 10
    row0 = positions[0][:, mask[0].bool()]
    assert row0[1:, 7:13].tolist() == [[7] * 6, [7, 7, 7, 8, 8, 8], [7, 8, 9, 7, 8, 9]]
    assert row0[1:, 13].tolist() == [10, 10, 10]


def test_qwen3_vl_rows_take_its_16_pixel_patches(tmp_path):
    """Qwen3-VL's image processor cuts 16-pixel patches: a 70 x 100 image is resized to 64 x 96 (multiples of 32),
    a grid of 4 x 6 patches of 3 * 2 * 16 * 16 values, merged 2 x 2 into 6 tokens at Qwen2-VL's positions."""
    path = save_tiny_vlm(tmp_path / "model", "qwen3_vl")
    tokenizer, prompts = AutoTokenizer.from_pretrained(path), load_image_prompts(path, AutoConfig.from_pretrained(path))
    assert prompts.model.model_type == "qwen3_vl" and prompts.model.architecture.deepstack
    file = write_parquet_atomic([geo_row("<image>Find x.", [{"bytes": png_bytes(random_image(70, 100, 1))}])],
                                tmp_path / "geo.parquet")
    ds = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=64), processor=prompts)
    assert ds.prompt_lengths.tolist() == [TEMPLATE_TOKENS + len("Find x.") + 2 + 6]
    batch = ds.get_batch([0])
    vision = batch.non_tensor_batch[MULTI_MODAL_INPUTS][0]
    assert vision["image_grid_thw"].tolist() == [[1, 4, 6]]
    assert tuple(vision["pixel_values"].shape) == (24, 1536)
    mask = batch.batch["attention_mask"][0].bool()
    assert int((batch.batch["input_ids"][0] == prompts.model.image_token_id).sum()) == 6
    row = batch.batch["position_ids"][0][:, mask]
    assert row[1:, 7:14].tolist() == [[7] * 6 + [10], [7, 7, 7, 8, 8, 8, 10], [7, 8, 9, 7, 8, 9, 10]]


@pytest.mark.parametrize("images, text, message", [
    ([{"bytes": b"not a png"}], "<image>x", r"geo.parquet row 0 \(column 'images', data.image_key\): image 0 "
                                            "cannot be decoded"),
    ([], "<image>x", "the prompt has 1 <image> placeholders but the row has 0 images"),
    ([{"bytes": png_bytes(random_image(28, 28, 0))}] * 2, "<image>x", "1 <image> placeholders but the row has 2"),
    ([], "<video>x", "does not support video inputs"),
])
def test_bad_image_rows_are_refused_naming_file_row_and_key(tmp_path, vl_model, images, text, message):
    path, tokenizer, prompts = vl_model
    file = write_parquet_atomic([geo_row(text, images)], tmp_path / "geo.parquet")
    with pytest.raises(DataError, match=message):
        RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=64), processor=prompts)


def test_images_for_a_text_model_are_refused(tmp_path):
    file = write_parquet_atomic([geo_row("plain", []), geo_row("<image>x", [{"bytes": b"png"}], i=1)],
                                tmp_path / "geo.parquet")
    with pytest.raises(DataError, match="row 1 .*the row has images, but the model is not a vision-language model"):
        RLHFDataset(file, build_tiny_tokenizer(), DataConfig(max_prompt_length=64))


def test_a_prompt_with_images_is_not_truncated(tmp_path, vl_model):
    path, tokenizer, prompts = vl_model
    image = {"bytes": png_bytes(random_image(56, 56, 0))}
    rows = [geo_row("<image>" + "y" * 40, [image]), geo_row("<image>short", [image], i=1)]
    file = write_parquet_atomic(rows, tmp_path / "geo.parquet")
    with pytest.raises(DataError, match="row 0: the prompt with images is 65 tokens.*would cut its image tokens"):
        RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=48, truncation="left"), processor=prompts)
    kept = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=48, filter_overlong_prompts=True),
                       processor=prompts)
    assert kept.num_filtered == 1 and kept.prompt_lengths.tolist() == [TEMPLATE_TOKENS + 2 + 5 + 4]


def test_a_transformers_style_processor_is_read_for_its_image_half(tmp_path, vl_model):
    """veRL hands RLHFDataset transformers' processor (an image_processor and an image_token_id, among others):
    the same rows as with verlx's own."""
    from types import SimpleNamespace

    path, tokenizer, prompts = vl_model
    file = write_parquet_atomic([geo_row("<image>Find x.", [{"bytes": png_bytes(random_image(56, 84, 1))}])],
                                tmp_path / "geo.parquet")
    theirs = SimpleNamespace(image_processor=prompts.image_processor, image_token_id=prompts.model.image_token_id,
                             tokenizer=tokenizer)
    ours = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=64), processor=prompts).get_batch([0])
    via = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=64), processor=theirs).get_batch([0])
    assert torch.equal(ours.batch["input_ids"], via.batch["input_ids"])
    assert torch.equal(ours.batch["position_ids"], via.batch["position_ids"])
    assert torch.equal(ours.non_tensor_batch[MULTI_MODAL_INPUTS][0]["pixel_values"],
                       via.non_tensor_batch[MULTI_MODAL_INPUTS][0]["pixel_values"])


def test_a_vision_language_model_without_its_image_processor_is_refused(tmp_path):
    import os

    path = save_tiny_vlm(tmp_path / "model")
    os.remove(os.path.join(path, "preprocessor_config.json"))
    with pytest.raises(DataError, match=r"actor_rollout_ref.model.path=.* is a vision-language model \(qwen2_vl\) but "
                                        r"its image processor \(preprocessor_config.json\) could not be loaded"):
        load_image_prompts(path, AutoConfig.from_pretrained(path))
