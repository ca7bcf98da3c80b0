"""Model paths as transformers users write them: a local directory, or a Hugging Face hub id ("org/name").

A hub id is resolved to its snapshot in the Hugging Face cache (HF_HOME / HF_HUB_CACHE), downloading it when the
hub can be reached, exactly once in the driver before Ray starts; the local path is written back into the config
so that no worker ever talks to the hub. Offline (HF_HUB_OFFLINE=1, or no network) a model that is not cached is
refused with the command that downloads it.
"""

from __future__ import annotations

import logging
import os
import re

from verlx.config.loader import ConfigError
from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)

# "org/name": what `from_pretrained` takes as a hub id (a path to a directory that exists wins, as in transformers).
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
# Files of other runtimes that repositories often carry next to the weights verlx loads.
_NOT_NEEDED = ["*.gguf", "*.onnx", "onnx/*", "*.msgpack", "*.h5", "*.tflite", "*.ot", "original/*", "*.mlmodel"]


def is_hub_id(path: str) -> bool:
    """True for "org/name" that is not a local file or directory."""
    return bool(_HUB_ID.match(path)) and not os.path.exists(expand_path(path))


def resolve_model_path(path: str, key: str) -> str:
    """`path` itself when it is not a hub id, else the local snapshot directory of that hub model."""
    if not is_hub_id(path):
        return path
    from huggingface_hub import constants, errors, snapshot_download

    incomplete = getattr(errors, "IncompleteSnapshotError", errors.LocalEntryNotFoundError)
    try:
        return snapshot_download(path, ignore_patterns=_NOT_NEEDED)
    except (errors.RepositoryNotFoundError, errors.GatedRepoError, errors.RevisionNotFoundError) as e:
        raise ConfigError([
            f"{key}={path!r}: not a local directory, and the Hugging Face hub refused it as a model id "
            f"({type(e).__name__}). Check the id; for a gated or private model, log in first (`hf auth login`) "
            "and accept its licence on the hub"]) from None
    except (errors.LocalEntryNotFoundError, incomplete, errors.HfHubHTTPError) as e:
        offline = constants.HF_HUB_OFFLINE
        why = ("HF_HUB_OFFLINE=1 is set" if offline else
               f"the hub could not be reached ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
        raise ConfigError([
            f"{key}={path!r}: not a local directory, and the Hugging Face model {path} is not (completely) in the "
            f"local cache {constants.HF_HUB_CACHE}, and {why}. Download it where the hub is reachable with "
            f"`hf download {path}` (`huggingface-cli download {path}` with older huggingface_hub) into the same "
            f"cache (HF_HOME / HF_HUB_CACHE), then run again (with HF_HUB_OFFLINE=1 if this machine is offline); "
            "or set the key to a local model directory"]) from None


def resolve_model_paths(fields: list[tuple[str, object, str]]) -> None:
    """For each (config key, section, attribute): a hub id in `section.attribute` is replaced by its local snapshot
    directory. Every id that cannot be resolved is reported at once."""
    problems = []
    for key, section, attribute in fields:
        value = getattr(section, attribute)
        if value is None or not is_hub_id(value):
            continue
        try:
            local = resolve_model_path(value, key)
        except ConfigError as e:
            problems += e.problems
            continue
        logger.info("%s=%s is the Hugging Face model in %s", key, value, local)
        setattr(section, attribute, local)
    if problems:
        raise ConfigError(problems)
