"""Reward managers: decode a rollout batch, score every response, put each score on its last response token.

Scoring runs in an isolated process pool (verlx.reward.isolation) unless reward.num_workers=0. A sample whose
function raised, timed out or returned something that is not a finite number gets reward.error_score and is
counted (reward/errors, reward/timeouts); the first reward.show_errors failures are logged with their text and
traceback; too many failures (or all of them) raise RewardFailure instead of training on made-up zeros.
"""

from __future__ import annotations

import logging
import math
import numbers
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from verlx.config.reward_model import OverlongBufferConfig
from verlx.config.run import RewardConfig
from verlx.protocol import DataProto
from verlx.reward.isolation import ScoreOutcome, ScorePool
from verlx.reward.loading import load_reward_function
from verlx.reward.scores import default_compute_score
from verlx.utils.errors import VerlxError
from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)

REWARD_MANAGERS: Registry[type[NaiveRewardManager]] = Registry("reward manager", "reward_model.reward_manager")
SHOWN_TEXT_CHARS = 2000
MAX_LISTED_SAMPLES = 20
# what the scores are for → (what is refused, the scope of the failure fraction, the remedy without any score, the
# remedy with some): the trainer's batches, or main_eval's report
# what a batch's "rm_scores" (the reward model's, trainer/reward_model.py) are to the manager: the reward itself
# (veRL: a reward manager returns rm_scores when present), or a value the reward function combines
# (custom_reward_function.path: extra_info["rm_score"])
RM_SCORE_USES = ("reward", "extra_info")
PURPOSES = {
    "train": ("train on", "the batch", "no setting trains on a batch without rewards", "train on"),
    "report": ("report", "the responses", "no setting reports on responses without scores", "report anyway"),
}


class RewardFailure(VerlxError, RuntimeError):
    """Too many reward computations of one batch failed to trust the rewards."""


@dataclass
class RewardResult:
    """token_level_scores [B, R] float32: each sample's reward at its last valid response token (column 0 for
    an empty response, so token_level_scores.sum(-1) is always the sample's reward).
    extra: per-sample numpy arrays ("score", the keys of dict-returning functions, "reward_status", DAPO's
    "overlong_reward"/"overlong"). metrics: reward/errors, reward/timeouts, reward/error_rate."""

    token_level_scores: torch.Tensor
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Scored:
    score: float
    details: dict | None
    status: str  # ok | error | timeout | aborted
    error: str = ""


def _finite_number(value: Any) -> float | None:
    """float(value) for a real number (Python, numpy or a one-element tensor) that is finite, else None."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            return None
        value = value.item()
    elif isinstance(value, (np.ndarray, np.generic)):
        if value.size != 1 or value.dtype.kind not in "biuf":
            return None
        value = value.item()
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{text[:200]}{'...' if len(text) > 200 else ''} ({type(value).__name__})"


def interpret_outcome(outcome: ScoreOutcome, error_score: float) -> _Scored:
    """A raw outcome → the sample's score; any return that is not a finite number (or a dict with one under
    'score') is a failure."""
    if not outcome.ok:
        return _Scored(error_score, None, outcome.status, outcome.traceback)
    value = outcome.value
    if isinstance(value, dict):
        score = _finite_number(value.get("score"))
        if score is None:
            return _Scored(
                error_score,
                None,
                "error",
                f"the reward function returned a dict whose 'score' is {_describe(value.get('score'))}; "
                "a dict return needs a finite number under 'score'",
            )
        return _Scored(score, value, "ok")
    score = _finite_number(value)
    if score is None:
        return _Scored(
            error_score,
            None,
            "error",
            f"the reward function returned {_describe(value)}; it must return a finite number or a dict with 'score'",
        )
    return _Scored(score, None, "ok")


def _column(values: list[Any]) -> np.ndarray:
    """Numbers become a float array (NaN where missing), anything else an object array (None where missing)."""
    if all(v is None or isinstance(v, (numbers.Real, np.bool_)) for v in values):
        return np.array([np.nan if v is None else float(v) for v in values], dtype=np.float64)
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):  # element by element: list values must not become extra dimensions
        out[i] = value
    return out


@REWARD_MANAGERS.register("naive")
class NaiveRewardManager:
    """Score = compute_score(data_source, response text, ground truth, extra_info), on the last token."""

    def __init__(
        self,
        tokenizer,
        compute_score: Callable | None = None,
        reward_fn_key: str = "data_source",
        config: RewardConfig | None = None,
        overlong_buffer: OverlongBufferConfig | None = None,
        max_response_length: int | None = None,
        purpose: str = "train",
        overlong_keys: tuple[str, str] = ("reward_model.overlong_buffer", "data.max_response_length"),
        rm_score_use: str = "reward",
        experiment_name: str | None = None,
    ):
        self.tokenizer = tokenizer
        self.experiment_name = experiment_name
        self.purpose = PURPOSES[purpose]
        self.compute_score = compute_score or default_compute_score
        self.reward_fn_key = reward_fn_key
        self.config = config or RewardConfig()
        self.overlong_buffer = overlong_buffer or OverlongBufferConfig()
        self.max_response_length = max_response_length
        self.overlong_keys = overlong_keys
        if rm_score_use not in RM_SCORE_USES:
            raise ValueError(f"rm_score_use={rm_score_use!r} is not one of {RM_SCORE_USES}")
        self.rm_score_use = rm_score_use
        self._check_config()
        self._pool = (
            ScorePool(self.compute_score, self.config.num_workers, self.config.timeout_s)
            if self.config.num_workers > 0
            else None
        )

    def _check_config(self) -> None:
        c = self.config
        if c.num_workers < 0:
            raise ValueError(f"reward.num_workers must be >= 0 (0 = score in the driver), got {c.num_workers}")
        if not 0.0 <= c.max_error_fraction <= 1.0:
            raise ValueError(f"reward.max_error_fraction must be within [0, 1], got {c.max_error_fraction}")
        if not math.isfinite(c.error_score):
            raise ValueError(f"reward.error_score must be a finite number, got {c.error_score}")
        self._check_shaping()

    def _check_shaping(self) -> None:
        if self.overlong_buffer.enable:
            raise ValueError(
                f"{self.overlong_keys[0]}.enable=true needs reward_model.reward_manager=dapo "
                f"(the {type(self).__name__} does not shape rewards by length)"
            )

    # ------------------------------------------------------------------ one batch
    def __call__(self, data: DataProto) -> RewardResult:
        if "rm_scores" in data.batch and self.rm_score_use == "reward":
            return self.reward_model_result(data.batch["rm_scores"])
        responses = data.batch["responses"]
        batch_size, width = responses.shape
        mask = self._response_mask(data, width)
        lengths = mask.sum(-1)
        positions = torch.arange(1, width + 1, device=mask.device)
        last = (mask * positions).argmax(-1) if width else torch.zeros(batch_size, dtype=torch.long)
        texts = self._decode(responses, torch.where(lengths > 0, last + 1, 0))
        calls = self._calls(data, texts)
        if "rm_scores" in data.batch:  # the reward function combines the reward model's score with its own
            for call, rm_score in zip(calls, data.batch["rm_scores"].sum(-1).tolist()):
                info = call["extra_info"] if isinstance(call["extra_info"], dict) else {}
                call["extra_info"] = {**info, "rm_score": rm_score}
        scored, metrics = self.score_calls(calls)

        scores = torch.tensor([s.score for s in scored], dtype=torch.float32)
        extra: dict[str, np.ndarray] = {"score": scores.numpy().astype(np.float64)}
        for key in dict.fromkeys(k for s in scored if s.details for k in s.details):
            if key != "score":
                extra[key] = _column([s.details.get(key) if s.details else None for s in scored])
        extra["reward_status"] = _column([s.status for s in scored])
        rewards = scores + self.length_shaping(lengths.cpu(), extra)

        token_level_scores = torch.zeros(batch_size, width, dtype=torch.float32)
        if width:
            token_level_scores.scatter_(1, last.cpu()[:, None], rewards[:, None])
        return RewardResult(token_level_scores.to(responses.device), extra, metrics)

    @staticmethod
    def reward_model_result(rm_scores: torch.Tensor) -> RewardResult:
        """The reward model's scores as the reward (veRL's reward managers return rm_scores when present): no
        reward function runs and nothing is shaped."""
        scores = rm_scores.float()
        sums = scores.sum(-1).cpu().numpy().astype(np.float64)
        return RewardResult(scores, {"score": sums, "reward_status": _column(["ok"] * len(sums))})

    def score_calls(self, calls: list[dict]) -> tuple[list[_Scored], dict[str, float]]:
        """Score reward-function calls (data_source, solution_str, ground_truth, extra_info), in the isolated pool
        unless reward.num_workers=0: failures get reward.error_score, are logged and counted, and too many of them
        raise RewardFailure. Returns every call's outcome and the reward/errors, timeouts and error_rate metrics."""
        scored = [interpret_outcome(o, self.config.error_score) for o in self._run(calls)]
        return scored, self._account(scored, calls, [call["solution_str"] for call in calls])

    def length_shaping(self, lengths: torch.Tensor, extra: dict[str, np.ndarray]) -> torch.Tensor:
        """Added to each sample's score (the naive manager adds nothing)."""
        return torch.zeros(lengths.shape[0], dtype=torch.float32)

    @staticmethod
    def _response_mask(data: DataProto, width: int) -> torch.Tensor:
        if "response_mask" in data.batch:
            return data.batch["response_mask"].long()
        if "attention_mask" in data.batch:
            return data.batch["attention_mask"][:, data.batch["attention_mask"].shape[1] - width :].long()
        raise KeyError(
            f"the reward batch needs 'response_mask' [B, R] or 'attention_mask' [B, P+R]; it has {sorted(data.batch)}"
        )

    def _decode(self, responses: torch.Tensor, ends: torch.Tensor) -> list[str]:
        """One batch_decode of every response up to its last valid token (only valid tokens become lists)."""
        rows = responses.cpu().numpy()
        return self.tokenizer.batch_decode(
            [row[:end].tolist() for row, end in zip(rows, ends.tolist())], skip_special_tokens=True
        )

    def _calls(self, data: DataProto, texts: list[str]) -> list[dict]:
        nt = data.non_tensor_batch
        if self.reward_fn_key not in nt:
            raise KeyError(
                f"the reward batch has no non-tensor '{self.reward_fn_key}' (data.reward_fn_key) to pick the "
                f"reward function by; present: {sorted(nt)}"
            )
        reward_models = nt.get("reward_model", [None] * len(texts))
        extra_infos = nt.get("extra_info", [None] * len(texts))
        if "multi_turn_messages" in nt:  # agent-loop rollouts: the conversation with the tool results
            extra_infos = [self._multi_turn_info(info, nt, i) for i, info in enumerate(extra_infos)]
        return [
            dict(
                data_source=source,
                solution_str=text,
                ground_truth=rm.get("ground_truth") if isinstance(rm, dict) else None,
                extra_info=dict(info) if isinstance(info, dict) else info,
            )
            for source, text, rm, info in zip(nt[self.reward_fn_key], texts, reward_models, extra_infos)
        ]

    @staticmethod
    def _multi_turn_info(info, nt: dict, i: int) -> dict:
        """The row's extra_info with the agent loop's record of sample i: `multi_turn` (verlx's), and veRL's
        `turn_scores` (the interaction's score of each user turn, where veRL's reward managers put them)."""
        scores = nt.get("multi_turn_turn_scores")
        return {**(info if isinstance(info, dict) else {}),
                "turn_scores": [] if scores is None else list(scores[i]),
                "multi_turn": {"messages": list(nt["multi_turn_messages"][i]),
                               "num_turns": int(nt["multi_turn_num_turns"][i]),
                               "tool_calls": int(nt["multi_turn_tool_calls"][i]),
                               "stop_reason": str(nt["multi_turn_stop_reason"][i])}}

    def _run(self, calls: list[dict]) -> list[ScoreOutcome]:
        if self._pool is not None:
            allowed = math.floor(self.config.max_error_fraction * len(calls))
            return self._pool.map(calls, max_failures=allowed)
        outcomes = []
        for call in calls:
            try:
                outcomes.append(ScoreOutcome("ok", self.compute_score(**call)))
            except Exception:
                outcomes.append(ScoreOutcome("error", traceback=traceback.format_exc()))
        return outcomes

    # ------------------------------------------------------------------ failures
    def _account(self, scored: list[_Scored], calls: list[dict], texts: list[str]) -> dict[str, float]:
        failed = [i for i, s in enumerate(scored) if s.status in ("error", "timeout")]
        timeouts = sum(scored[i].status == "timeout" for i in failed)
        n = len(scored)
        for i in failed[: self.config.show_errors]:
            logger.warning("reward computation failed:\n%s", self._failure_report(i, scored, calls, texts))
        if failed and (len(failed) == n or len(failed) > self.config.max_error_fraction * n):
            raise RewardFailure(self._refusal(failed, timeouts, scored, calls, texts))
        return {
            "reward/errors": float(len(failed) - timeouts),
            "reward/timeouts": float(timeouts),
            "reward/error_rate": len(failed) / n if n else 0.0,
        }

    def _refusal(self, failed: list[int], timeouts: int, scored: list[_Scored], calls, texts) -> str:
        """Why the batch is refused: counts, the failed samples, what to do, the first failure in full."""
        n, limit = len(scored), self.config.max_error_fraction
        unscored = sum(s.status == "aborted" for s in scored)
        counts = f"{len(failed) - timeouts} errors, {timeouts} timeouts"
        if unscored:
            counts += f"; {unscored} samples left unscored once the outcome was certain"
        shown = ", ".join(map(str, failed[:MAX_LISTED_SAMPLES])) + (
            f", ... ({len(failed) - MAX_LISTED_SAMPLES} more)" if len(failed) > MAX_LISTED_SAMPLES else "")
        refused, scope, no_remedy, relaxed = self.purpose
        if len(failed) == n:
            why, remedy = "every sample", f"Fix the reward function ({no_remedy})."
        else:
            why = f"more than reward.max_error_fraction={limit} of {scope}"
            remedy = (f"Fix the reward function, or set reward.max_error_fraction=1.0 to {relaxed}, with "
                      f"reward.error_score={self.config.error_score:g} for the failed samples.")
        return (
            f"{len(failed)}/{n} reward computations failed ({counts}): {why}. Refusing to {refused} made-up rewards. "
            f"Failed samples: {shown}. {remedy} First failure:\n"
            + self._failure_report(failed[0], scored, calls, texts)
        )

    @staticmethod
    def _failure_report(i: int, scored: list[_Scored], calls: list[dict], texts: list[str]) -> str:
        text = texts[i]
        if len(text) > SHOWN_TEXT_CHARS:
            half = SHOWN_TEXT_CHARS // 2
            text = f"{text[:half]}\n[... {len(text) - 2 * half} characters ...]\n{text[-half:]}"
        return (
            f"sample {i} ({scored[i].status}), data_source={calls[i]['data_source']!r}, "
            f"ground_truth={calls[i]['ground_truth']!r}\nresponse:\n{text}\n{scored[i].error.rstrip()}"
        )

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(NaiveRewardManager):
    """Naive scoring plus DAPO's overlong shaping: a penalty growing linearly from 0 to -penalty_factor over the
    last overlong_buffer.len tokens of the allowed response length."""

    def _check_shaping(self) -> None:
        buffer = self.overlong_buffer
        key, max_key = self.overlong_keys
        if not buffer.enable:
            return
        if buffer.len <= 0:
            raise ValueError(f"{key}.len must be > 0 when enabled, got {buffer.len}")
        if self.max_response_length is None or buffer.len > self.max_response_length:
            raise ValueError(f"{key}.len={buffer.len} must not exceed {max_key}={self.max_response_length}")

    def length_shaping(self, lengths: torch.Tensor, extra: dict[str, np.ndarray]) -> torch.Tensor:
        buffer = self.overlong_buffer
        if not buffer.enable:
            return super().length_shaping(lengths, extra)
        expected = self.max_response_length - buffer.len
        penalty = (-(lengths.double() - expected) / buffer.len * buffer.penalty_factor).clamp(max=0.0)
        if buffer.log:
            extra["overlong_reward"] = penalty.numpy()
            extra["overlong"] = (penalty < 0).numpy()
        return penalty.float()


def overlong_shaping(config) -> tuple[OverlongBufferConfig, int | None, tuple[str, str]]:
    """DAPO's overlong settings in force, the response length its window ends at, and their keys: veRL 0.9.1's
    reward_model.reward_kwargs.overlong_buffer_cfg (ending at reward_kwargs.max_resp_len) when enabled, else the DAPO
    recipe's reward_model.overlong_buffer (ending at data.max_response_length). One feature, two spellings."""
    kwargs = config.reward_model.reward_kwargs
    if kwargs.overlong_buffer_cfg.enable:
        keys = ("reward_model.reward_kwargs.overlong_buffer_cfg", "reward_model.reward_kwargs.max_resp_len")
        return kwargs.overlong_buffer_cfg, kwargs.max_resp_len, keys
    return (config.reward_model.overlong_buffer, config.data.max_response_length,
            ("reward_model.overlong_buffer", "data.max_response_length"))


@REWARD_MANAGERS.register("gdpo")
class GDPORewardManager(NaiveRewardManager):
    """veRL's GDPO manager: naive scoring, with the run's trainer.experiment_name in every extra_info (veRL's GDPO
    example reward function picks the chat format by it). The GDPO estimator normalises the reward function's
    returned columns (algorithm.gdpo_reward_keys) as with any manager."""

    def _calls(self, data: DataProto, texts: list[str]) -> list[dict]:
        calls = super()._calls(data, texts)
        for call in calls:
            info = call["extra_info"] if isinstance(call["extra_info"], dict) else {}
            call["extra_info"] = {**info, "experiment_name": self.experiment_name or ""}
        return calls


def build_reward_manager(config, tokenizer) -> NaiveRewardManager:
    """The manager a PPOConfig asks for: reward_model.reward_manager scoring with custom_reward_function (or
    the built-in scores), isolated per the reward section. With a reward model, its scores are the reward unless
    custom_reward_function.path is set (then the function gets them as extra_info["rm_score"])."""
    manager_cls = REWARD_MANAGERS.get(config.reward_model.reward_manager)
    buffer, max_length, keys = overlong_shaping(config)
    return manager_cls(
        tokenizer,
        load_reward_function(config.custom_reward_function),
        reward_fn_key=config.data.reward_fn_key,
        config=config.reward,
        overlong_buffer=buffer,
        max_response_length=max_length,
        overlong_keys=keys,
        rm_score_use="extra_info" if config.custom_reward_function.path else "reward",
        experiment_name=config.trainer.experiment_name,
    )
