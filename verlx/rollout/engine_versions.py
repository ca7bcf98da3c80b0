"""Which SGLang / vLLM releases the adapters support, and why; checked before an engine is built.

The adapters call a handful of in-process APIs whose shape changed between releases. The ranges below are the
releases whose documented APIs the adapters follow; outside them an adapter would fail in ways that are hard to
read (a missing keyword deep inside the engine, a weight update that silently does nothing), so it refuses early.
"""

from __future__ import annotations

import importlib.metadata
import logging
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from verlx.utils.errors import InputError

logger = logging.getLogger(__name__)
_warned_untested: set[str] = set()


class UnsupportedEngineVersion(InputError, RuntimeError):
    """The installed engine package is outside the release range the adapter was written for."""


@dataclass(frozen=True)
class SupportedRange:
    package: str
    minimum: str  # inclusive
    below: str  # exclusive
    reason: str
    install_hint: str
    #: releases run inside verlx on the GPU machine (docs/rollout.md has the table); others in range warn once
    tested: tuple[str, ...] = ()
    #: torch release (major.minor or exact) -> the engine releases that pin it, as a pip requirement
    torch_pins: tuple[tuple[str, str], ...] = ()

    def contains(self, version: Version) -> bool:
        return _release(self.minimum) <= _release(version) < _release(self.below)

    def describe(self) -> str:
        return f"{self.package}>={self.minimum},<{self.below}"


SUPPORTED_RANGES: dict[str, SupportedRange] = {
    "sglang": SupportedRange(
        package="sglang",
        minimum="0.5.9",
        below="0.6",
        reason=(
            "0.5.9 is the first release whose TP memory-imbalance check obeys SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK "
            "(colocated trainers always unbalance GPU memory) and whose release/resume_memory_occupation tags and "
            "CPU weight backup the sleep cycle relies on; the adapter handles the msgspec ServerArgs of 0.5.20+ and "
            "the begin/end_weight_update session of 0.5.21+ (documented up to 0.5.23); 0.6 may change these APIs again"
        ),
        install_hint="pip install 'verlx[sglang]'",
        tested=("0.5.17",),
        torch_pins=(("2.11", "sglang>=0.5.14,<0.5.19"), ("2.14.1", "sglang==0.5.23")),
    ),
    "vllm": SupportedRange(
        package="vllm",
        minimum="0.11.0",
        below="0.34",
        reason=(
            "0.11.0 removed the V0 engine, so the model is reachable at one documented path "
            "(llm_engine.model_executor.driver_worker.worker.model_runner.model), prompts are TokensPrompt, and "
            "logprobs_mode='processed_logprobs' (log-probs of the temperature-scaled distribution the trainer "
            "compares with) exists; documented up to 0.33.x"
        ),
        install_hint="pip install 'verlx[vllm]'",
        tested=("0.26.0",),
        torch_pins=(("2.11", "vllm>=0.20,<0.27"), ("2.14.0", "vllm==0.33.0")),
    ),
}


def _release(version: str | Version) -> tuple[int, ...]:
    """The release numbers without trailing zeros, so 0.11 == 0.11.0 and pre/post/local tags are ignored."""
    release = list((version if isinstance(version, Version) else Version(version)).release)
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    return tuple(release)


def install_command(package: str, torch_version: str | None = None) -> str:
    """The pip command that installs `package` without replacing the user's torch, where a release pinned to it is
    known; otherwise the extra, with a warning that it brings its own torch."""
    supported = SUPPORTED_RANGES[package]
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    torch_release = torch_version.split("+")[0]
    for pinned, requirement in supported.torch_pins:
        if torch_release == pinned or (pinned.count(".") == 1 and torch_release.startswith(pinned + ".")):
            return f"pip install '{requirement}' (the releases pinned to your torch {torch_release})"
    return (f"{supported.install_hint} (no {package} release known here pins your torch {torch_release}; the one pip "
            f"picks installs its own torch: use a separate environment)")


def installed_version(package: str) -> str:
    """The installed distribution version of `package` (without importing it)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        hint = install_command(package) if package in SUPPORTED_RANGES else f"pip install {package}"
        raise RuntimeError(f"the '{package}' package is not installed; install it with: {hint}") from None


def check_engine_version(package: str, version: str | None = None) -> Version:
    """Parse the installed (or given) version of `package` and refuse it outside the supported range."""
    supported = SUPPORTED_RANGES[package]
    text = installed_version(package) if version is None else version
    try:
        parsed = Version(text)
    except InvalidVersion:
        raise UnsupportedEngineVersion(f"cannot parse the installed {package} version {text!r}") from None
    if not supported.contains(parsed):
        raise UnsupportedEngineVersion(
            f"{package} {text} is not supported by actor_rollout_ref.rollout.name={package}; supported: "
            f"{supported.describe()}. Why: {supported.reason}. Install a supported release "
            f"({install_command(package)}) or choose rollout.name=native."
        )
    if supported.tested and str(parsed) not in supported.tested and package not in _warned_untested:
        _warned_untested.add(package)
        logger.warning("%s %s is in the supported range %s but not among the releases run inside verlx on a GPU "
                       "(%s): the adapter follows its documented API; report what breaks", package, text,
                       supported.describe(), ", ".join(supported.tested))
    return parsed


def at_least(version: Version, minimum: str) -> bool:
    """Release comparison that treats 0.5.21.post1 / 0.5.21rc0 / 0.5.21+cu128 as 0.5.21."""
    return _release(version) >= _release(minimum)
