"""Load a predict YAML, apply ``--set`` overrides, validate once, render errors as one line."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aisim.simulator.config.models import PredictConfig
from aisim.simulator.config.paths import deep_copy, set_path
from aisim.simulator.errors import InputError

MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_NODES = 100_000  # nodes of a YAML document once its aliases are expanded
_UNION_PARENTS = {("traffic", "source"), ("traffic", "load")}


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


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply overrides left to right on a copy (``data`` is not changed); missing intermediate
    mappings are created."""
    out = deep_copy(data)
    for text in overrides:
        parts, value = parse_override(text)
        set_path(out, parts, value, field=f"--set {text}")
    return out


_MEMBER_TAG = re.compile(r"^(literal\[.*\]|constrained-\w+|int|float|str|bool|none|function-\w+\[.*\])$")


def format_validation_error(exc: ValidationError) -> InputError:
    """First pydantic error as ``path: message`` (union tags dropped), plus a count of the rest."""
    errors = exc.errors(include_url=False)
    err = errors[0]
    members = [err]
    loc = list(err["loc"])
    if loc and isinstance(loc[-1], str) and _MEMBER_TAG.match(loc[-1]):
        # a plain union (``'auto' | int``): one message for all its members, not one per member
        members = [e for e in errors if list(e["loc"][:-1]) == loc[:-1]]
        wants = [e["msg"].removeprefix("Input should be ") for e in members]
        err = {**err, "loc": tuple(loc[:-1]), "msg": "Input should be " + " or ".join(wants)}
        errors = [err] + [e for e in errors if e not in members]
        loc = loc[:-1]
    clean: list[str] = []
    for i, part in enumerate(loc):
        if i >= 2 and (str(loc[i - 2]), str(loc[i - 1])) in _UNION_PARENTS and isinstance(part, str) and i == 2:
            continue  # discriminated-union tag, e.g. traffic.source.<trace>.paths
        clean.append(str(part))
    path = ".".join(clean) or "config"
    kind = err["type"]
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        msg += "; remove the key or fix its spelling"
    elif kind == "missing":
        msg += "; add it"
    elif kind == "union_tag_invalid":
        pass
    elif "input" in err and not isinstance(err["input"], (dict, list)) and kind not in ("value_error", "assertion_error"):
        msg += f" (got {err['input']!r})" + _number_hint(err["input"], {e["type"] for e in members})
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    category = "invalid_config"
    if clean and kind != "extra_forbidden":  # a rejected value of these fields has its own category
        category = _FIELD_CATEGORY.get(clean[-1], category)
    return InputError(path, msg, category=category)


def _number_hint(value, kinds: set[str]) -> str:
    """Why a value that looks like a number is not taken as one (the number types are strict)."""
    if "int_type" not in kinds and "float_type" not in kinds:
        return ""
    if isinstance(value, bool):
        return "; true/false is a boolean, not a number"
    if isinstance(value, float) and "int_type" in kinds and "float_type" not in kinds:
        return "; this field takes a whole number, written without a decimal point"
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return ""
        return "; a quoted number is text: remove the quotes"
    return ""


_FIELD_CATEGORY = {"context_length": "context_length", "max_model_len": "context_length"}


def validate_config(data: dict) -> PredictConfig:
    for key in data:
        if not isinstance(key, str) or not key or "." in key:
            raise InputError(str(key), "top-level keys must be non-empty section names without dots")
    try:
        return PredictConfig.model_validate(data)
    except ValidationError as exc:
        raise format_validation_error(exc) from None


def load_config(path: Path | None, overrides: list[str] | None = None, default_path: Path | None = None) -> tuple[PredictConfig, Path]:
    """Read, override and validate a config. Returns the model and the config's directory."""
    src = path if path is not None else default_path
    if src is None:
        raise InputError("--config", "no config given")
    data = read_yaml_mapping(src)
    data = apply_overrides(data, overrides or [])
    return validate_config(data), src.resolve().parent
