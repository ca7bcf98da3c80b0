"""Chat-template arithmetic on token ids: the prompt, the delta of a tool/user turn, and the final check.

The model's own tokens are never decoded and re-encoded into the trajectory. What the trajectory adds between
model turns (tool results, user replies, the next generation prompt) is the template's *delta*: the text the
template renders after an assistant turn's end-of-turn token, computed on a fixed two-message base
(user "U", assistant "A") so that it does not depend on how the template re-renders earlier turns (Qwen3-style
templates drop earlier turns' thinking, which breaks naive "render all, subtract" schemes).

Once per multi-turn sample `check_trajectory` re-tokenises the whole final conversation with the template and
aligns it with the trajectory: every template-inserted segment (prompt, deltas) must appear verbatim, in order.
A segment that does not is a *mismatch* (the sample is excluded from training). Differences inside the model's
own turns (the template re-renders the model's words: drops earlier thinking, normalises whitespace, re-tokenises
text the model spelled with other tokens) are *rewrites*: counted, and the sample trains on what was generated.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

BASE_USER = "U"
BASE_ASSISTANT = "A"


class TemplateDeltaError(ValueError):
    """The template renders a turn so that the conversation before it changes (no append-only delta exists)."""


@dataclass
class CheckResult:
    mismatch: bool
    rewrite: bool
    detail: str = ""


class ChatCodec:
    """Renders and tokenises with one tokenizer's chat template, the tools' schemas and template kwargs."""

    def __init__(self, tokenizer, tools: list[dict] | None, template_kwargs: dict | None, stop_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self.stop_ids = frozenset(int(t) for t in stop_token_ids)
        self.stop_texts = [t for t in tokenizer.convert_ids_to_tokens(list(stop_token_ids)) if t]
        self._base_end: str | None = None
        self._gen_extra: list[int] | None = None

    def render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=self.tools, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt, **self.template_kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt=True))

    # ------------------------------------------------------------------ deltas
    def _base_prefix(self) -> str:
        """The base conversation's text up to and including the assistant's end-of-turn token."""
        if self._base_end is None:
            text = self.render([{"role": "user", "content": BASE_USER},
                                {"role": "assistant", "content": BASE_ASSISTANT}], add_generation_prompt=False)
            start = text.rfind(BASE_ASSISTANT)
            ends = [(text.find(s, start), s) for s in self.stop_texts if text.find(s, start) >= 0]
            if start < 0 or not ends:
                raise TemplateDeltaError(
                    f"the chat template does not end an assistant turn with a stop token ({self.stop_texts}); "
                    f"rendered base: {text[-200:]!r}. Set the model's eos/stop tokens to the template's end-of-turn "
                    "token (generation_config.json eos_token_id)")
            pos, stop = min(ends)
            self._base_end = text[: pos + len(stop)]
        return self._base_end

    def delta_ids(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids the template puts after an assistant turn's end-of-turn token for `messages` (tool results
        or a user reply), ending with the next generation prompt."""
        prefix = self._base_prefix()
        base = [{"role": "user", "content": BASE_USER}, {"role": "assistant", "content": BASE_ASSISTANT}]
        full = self.render(base + list(messages), add_generation_prompt=add_generation_prompt)
        if not full.startswith(prefix):
            raise TemplateDeltaError(
                f"rendering {[m.get('role') for m in messages]} after an assistant turn changes the text before it "
                f"(expected it to start with {prefix[-80:]!r}, got {full[: len(prefix)][-80:]!r})")
        return self.encode(full[len(prefix):])

    # ------------------------------------------------------------------ the once-per-sample check
    def generation_prompt_extra(self) -> list[int]:
        """Tokens the generation prompt adds after the assistant header that a rendered assistant turn need not
        repeat (Qwen3's empty think block with enable_thinking=false): they belong to the model's turn."""
        if self._gen_extra is None:
            user = [{"role": "user", "content": BASE_USER}]
            without = self.render(user, add_generation_prompt=False)
            prompt = self.render(user, add_generation_prompt=True)[len(without):]
            turn = self.render(user + [{"role": "assistant", "content": BASE_ASSISTANT}], False)[len(without):]
            header = os.path.commonprefix([prompt, turn])
            self._gen_extra = self.encode(prompt[len(header):]) if len(header) < len(prompt) else []
        return self._gen_extra

    def check_trajectory(self, messages: list[dict], segments: list[tuple[list[int], bool]]) -> CheckResult:
        """Align the full re-tokenisation of `messages` with the trajectory's segments (ids, is_model). A trajectory
        that ends with a delta (an interaction's last message) ends with the generation prompt, as it does."""
        ends_with_delta = bool(segments) and not segments[-1][1]
        try:
            reference = np.asarray(self.encode(self.render(messages, add_generation_prompt=ends_with_delta)),
                                   dtype=np.int64)
        except Exception as e:  # a template that cannot render the final conversation
            return CheckResult(True, False, f"the template failed to render the final conversation: {e}")
        extra = self.generation_prompt_extra()
        pos, rewrite, model_ids = 0, False, None
        for i, (ids, is_model) in enumerate(segments):
            if is_model:
                model_ids = (model_ids or []) + list(ids)
                continue
            carry: list[int] = []
            if extra and len(ids) > len(extra) and list(ids[-len(extra):]) == extra:
                ids, carry = list(ids[: -len(extra)]), list(extra)
            if model_ids is None:  # the prompt: must start the reference
                if not _equal(reference[pos : pos + len(ids)], ids):
                    return CheckResult(True, False, _diff("prompt", reference[pos:], ids))
                pos += len(ids)
                model_ids = carry or None
                continue
            found = _find(reference, ids, pos)
            # a delta starts right after the end-of-turn token the model generated
            ends_turn = model_ids and model_ids[-1] in self.stop_ids
            if found < 0 or (ends_turn and (found == 0 or reference[found - 1] != model_ids[-1])):
                return CheckResult(True, False, _diff(f"segment {i} (after a model turn)", reference[pos:], ids))
            rewrite |= not _equal(reference[pos:found], model_ids)
            pos, model_ids = found + len(ids), carry or None
        if model_ids is not None:  # the last model turn; the template may add its end-of-turn and a newline
            tail = reference[pos:]
            rewrite |= not _equal(tail[: len(model_ids)], model_ids)
        elif pos != len(reference):
            return CheckResult(True, False, f"the re-tokenisation has {len(reference) - pos} tokens more at the end")
        return CheckResult(False, rewrite)


def _equal(a: np.ndarray, b: list[int]) -> bool:
    return len(a) == len(b) and bool(np.array_equal(a, np.asarray(b, dtype=np.int64)))


def _find(haystack: np.ndarray, needle: list[int], start: int) -> int:
    """First index >= start where needle occurs in haystack, or -1 (vectorised)."""
    n = len(needle)
    if n == 0:
        return start
    window = haystack[start:]
    if len(window) < n:
        return -1
    hits = np.flatnonzero((np.lib.stride_tricks.sliding_window_view(window, n) == np.asarray(needle)).all(-1))
    return int(hits[0]) + start if len(hits) else -1


def _diff(what: str, reference: Any, ids: list[int]) -> str:
    ref = [int(x) for x in reference[: len(ids) + 4]]
    k = next((j for j, (a, b) in enumerate(zip(ref, ids)) if a != b), min(len(ref), len(ids)))
    return (f"{what}: the template re-tokenisation differs at token {k} (trajectory {ids[max(0, k - 3):k + 5]}, "
            f"re-tokenisation {ref[max(0, k - 3):k + 5]})")
