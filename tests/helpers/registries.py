"""The entries of a registry that verlx itself ships: test helpers register planted faults beside them
(tests/helpers/learning_faults.py), which the registry-coverage tests must not count."""

from __future__ import annotations

from collections.abc import Callable


def shipped_names(registry, function_of: Callable = lambda entry: entry) -> list[str]:
    """Sorted names whose entry (`function_of(entry)`: the function it wraps) is defined inside verlx."""
    return [name for name in registry.names() if function_of(registry.get(name)).__module__.startswith("verlx.")]
