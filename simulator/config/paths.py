"""Dotted paths into config mappings: ``set_path(cfg, "engine.workers.aggregated.parallelism.replicas", 4)``.

- ``set_path`` changes the mapping it is given **in place** (and returns it); copy first, or use
  ``with_paths``, to keep the original. Missing (or null) intermediate keys become new mappings;
  an intermediate that holds anything else is an ``InputError`` naming the path.
- ``with_paths`` applies several paths to a deep copy and leaves its input untouched.
- ``get_path`` reads a value, or the default when any key on the way is missing.

A path is a dot-separated string or a sequence of keys (keys are strings; no list indexes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from typing import Any

from aisim.simulator.errors import InputError

KeyPath = str | Sequence[str]  # "a.b.c" or ("a", "b", "c")


def split_path(path: KeyPath, field: str | None = None) -> list[str]:
    """``"a.b.c"`` (or ``["a", "b", "c"]``) -> ``["a", "b", "c"]``; empty keys are an InputError."""
    parts = path.split(".") if isinstance(path, str) else [str(p) for p in path]
    if not parts or any(not p for p in parts):
        shown = path if isinstance(path, str) else ".".join(parts)
        raise InputError(field if field is not None else shown, "the path must be dot-separated keys, e.g. router.policy")
    return parts


def set_path(mapping: MutableMapping, path: KeyPath, value: Any, *, field: str | None = None) -> MutableMapping:
    """Set ``mapping[a][b][c] = value`` **in place**; returns ``mapping``.

    Missing or null intermediates become new dicts. An intermediate that is not a mapping raises
    ``InputError(field or the path, "a.b is a str, not a section; set a.b itself")``, before
    anything is changed (so a failed call leaves ``mapping`` as it was).
    """
    parts = split_path(path, field)
    node = mapping
    for depth, key in enumerate(parts[:-1]):
        nxt = node.get(key)
        if nxt is None:  # from here on every node is new, so nothing can fail after a change
            nxt = node[key] = {}
        elif not isinstance(nxt, MutableMapping):
            prefix = ".".join(parts[: depth + 1])
            raise InputError(field if field is not None else ".".join(parts),
                             f"{prefix} is a {type(nxt).__name__}, not a section; set {prefix} itself")
        node = nxt
    node[parts[-1]] = value
    return mapping


def get_path(mapping: Mapping, path: KeyPath, default: Any = None) -> Any:
    """``mapping[a][b][c]``, or ``default`` when a key is missing or an intermediate is not a mapping."""
    node: Any = mapping
    for key in split_path(path):
        if not isinstance(node, Mapping) or key not in node:
            return default
        node = node[key]
    return node


def deep_copy(x: Any) -> Any:
    """A copy of nested dicts and lists (other values are shared: configs hold immutable scalars)."""
    if isinstance(x, Mapping):
        return {k: deep_copy(v) for k, v in x.items()}
    if isinstance(x, list):
        return [deep_copy(v) for v in x]
    return x


def with_paths(mapping: Mapping, values: Mapping[str, Any] | Iterable[tuple[KeyPath, Any]]) -> dict:
    """A deep copy of ``mapping`` with each ``path: value`` set (values copied too), in order; neither
    ``mapping`` nor the values are changed."""
    out = deep_copy(mapping)
    for path, value in (values.items() if isinstance(values, Mapping) else values):
        set_path(out, path, deep_copy(value))
    return out
