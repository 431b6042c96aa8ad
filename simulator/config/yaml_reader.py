"""Reading YAML as aisim does: a mapping from a file (``read_yaml_mapping``), a ``--set``
value (``parse_override``), with duplicate keys and alias bombs refused. Its own module so that
a process that only validates mappings (a fan-out worker) never imports yaml; ``loading``
re-exports these names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from aisim.simulator.errors import InputError

MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # nodes of a YAML document once its aliases are expanded


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping sets the same key twice (plain YAML keeps the last one silently)."""

    def __init__(self, key, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(None, None, f"duplicate key {key!r}", again)
        self.key = key
        self.first_mark = first


class TooLargeError(yaml.YAMLError):
    """A document that expands past MAX_YAML_NODES nodes through its aliases, or is recursive."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class ConfigLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` for every YAML aisim reads (configs, ``--set`` values, planner configs):

    - a key set twice in one mapping is an error, not "the last one wins" (merge keys ``<<`` may
      still be overridden, as YAML intends);
    - a document is expanded (aliases counted as copies) before it is built: past MAX_YAML_NODES
      nodes, or an anchor used inside itself, it is refused (an alias bomb never grows);
    - YAML 1.2 floats written without a dot or an exponent sign (``1e3``, ``2.5e-3``) are floats,
      not the strings YAML 1.1 makes of them.
    """

    def construct_document(self, node):
        _check_expanded_size(node, MAX_YAML_NODES)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node.start_mark)
                except TypeError:  # an unhashable key: the base class reports it
                    continue
                if first is not key_node.start_mark:
                    raise DuplicateKeyError(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _children(node: yaml.Node) -> list:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def _check_expanded_size(root: yaml.Node, limit: int) -> None:
    """Count the nodes of ``root`` with every alias expanded (shared nodes counted once per use),
    without expanding anything: each node's size is memoised. Raises TooLargeError past ``limit``
    or on a recursive alias."""
    size: dict[int, int] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        nid = id(node)
        if closing:
            open_.discard(nid)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > limit:
                raise TooLargeError(f"the document expands to more than {limit:,} values through its aliases "
                                    "(*name); a config needs far fewer, so this looks like an alias bomb",
                                    node.start_mark)
            size[nid] = total
        elif nid in open_:
            raise TooLargeError("an anchor is used inside itself (a recursive alias); write the value out",
                                node.start_mark)
        elif nid not in size:
            open_.add(nid)
            stack.append((node, True))
            stack.extend((c, False) for c in _children(node))


def load_yaml(text: str):
    """``text`` as YAML, read with ConfigLoader (see there); yaml.YAMLError or RecursionError."""
    loader = ConfigLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def read_yaml_mapping(path: Path, what: str = "config") -> dict:
    try:
        size = path.stat().st_size
    except OSError:
        raise InputError(str(path), f"{what} file not found; pass an existing YAML file") from None
    if size > MAX_CONFIG_BYTES:
        raise InputError(str(path), f"{what} file is {size} bytes; the limit is {MAX_CONFIG_BYTES} (1 MiB)")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise InputError(f"{path}:{exc.problem_mark.line + 1}",
                         f"duplicate key {exc.key!r} (first set on line {exc.first_mark.line + 1}); "
                         "YAML would keep only the last one, so remove or rename one of them") from None
    except TooLargeError as exc:
        raise InputError(str(path), f"{what} refused: {exc.problem}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(where, f"invalid YAML ({problem})") from None
    except RecursionError:
        raise InputError(str(path), f"{what} is nested too deeply to read") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"cannot read {what} file: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(str(path), f"the {what} must be a YAML mapping of sections, got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=<YAML value>`` -> (["a", "b", "c"], value)."""
    if "=" not in text:
        raise InputError(f"--set {text}", "expected PATH=VALUE, e.g. --set engine.workers.aggregated.parallelism.replicas=4")
    path, _, raw = text.partition("=")
    parts = path.strip().split(".")
    if not path.strip() or any(not p for p in parts):
        raise InputError(f"--set {text}", "the path must be dot-separated keys, e.g. router.policy")
    for p in parts:
        if p.lstrip("-").isdigit():
            raise InputError(f"--set {text}", "list indexes are not supported; replace the whole list, "
                             "e.g. --set traffic.source.paths='[a.jsonl]'")
    try:
        value = load_yaml(raw) if raw.strip() else None
    except DuplicateKeyError as exc:
        raise InputError(f"--set {text}", f"the value sets key {exc.key!r} twice; keep one") from None
    except TooLargeError as exc:
        raise InputError(f"--set {text}", f"the value is refused: {exc.problem}") from None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError(f"--set {text}", f"the value is not valid YAML ({problem}); quote it for the shell") from None
    except RecursionError:
        raise InputError(f"--set {text}", "the value is nested too deeply") from None
    return parts, value
