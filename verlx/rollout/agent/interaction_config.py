"""The interaction file (multi_turn.interaction_config_path), in veRL's format:

    interaction:
      - name: gsm8k                                                  # what rows name in extra_info.interaction_kwargs
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # veRL's (read as verlx's) or yours
        config: {}                                                   # given to the class, with `name` added

Without `name`, the class's name in lower case without its "Interaction" suffix is the name (veRL's rule). Every
error names the file and the entry (interaction[i]) before any rollout starts.
"""

from __future__ import annotations

from verlx.rollout.agent.entry_files import load_named_entries, verlx_class_for
from verlx.rollout.agent.interactions import BaseInteraction
from verlx.utils.errors import InputError
from verlx.utils.registry import import_object

KEY = "actor_rollout_ref.rollout.multi_turn.interaction_config_path"
ENTRY_KEYS = {"name", "class_name", "config"}
# veRL's interaction classes verlx has its own of (each said once, at info level, when a file names it)
VERL_INTERACTIONS = {
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "verlx.reward.gsm8k_interaction:Gsm8kInteraction",
}


class InteractionConfigError(InputError, ValueError):
    """The interaction file does not load; the message names the file and the entry."""


def default_name(class_name: str) -> str:
    simple = class_name.replace(":", ".").rsplit(".", 1)[-1]
    return (simple[: -len("Interaction")] if simple.endswith("Interaction") else simple).lower()


def _entry_interaction(entry: dict, where: str) -> BaseInteraction:
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise InteractionConfigError(f"{where}: unknown keys {unknown}; an entry has {sorted(ENTRY_KEYS)}")
    class_name = entry.get("class_name")
    if not isinstance(class_name, str) or not class_name:
        raise InteractionConfigError(f"{where}: needs class_name (package.module.Class of a BaseInteraction)")
    config = entry.get("config")
    config = {} if config is None else config
    if not isinstance(config, dict):
        raise InteractionConfigError(f"{where}.config must be a mapping, got {config!r:.80}")
    name = entry.get("name") or default_name(class_name)
    if not isinstance(name, str):
        raise InteractionConfigError(f"{where}.name must be a string, got {name!r:.80}")
    cls = import_object(verlx_class_for(class_name, VERL_INTERACTIONS, "interaction"), f"{where}.class_name")
    if not (isinstance(cls, type) and issubclass(cls, BaseInteraction)):
        raise InteractionConfigError(f"{where}.class_name={class_name} is not a subclass of verlx's BaseInteraction "
                                     "(verlx.rollout.agent.interactions; veRL's interface, docs/multi_turn.md)")
    return cls({**config, "name": name})


def load_interactions(path: str) -> dict[str, BaseInteraction]:
    """name → interaction for every entry of the file; raises InteractionConfigError naming the file and the
    entry."""
    return load_named_entries(path, config_key=KEY, section="interaction", noun="interaction",
                              error=InteractionConfigError, build=_entry_interaction,
                              hint=" ({name, class_name, config}, veRL's interaction config)")
