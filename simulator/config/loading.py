"""Load a predict YAML, apply ``--set`` overrides, validate once, render errors as one line."""

from __future__ import annotations

import re

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from simulator.config.models import PredictConfig
from simulator.config.paths import deep_copy, set_path
from simulator.errors import InputError

MAX_CONFIG_BYTES = 1 << 20
_UNION_PARENTS = {("traffic", "source"), ("traffic", "load")}


def read_yaml_mapping(path: Path, what: str = "config") -> dict:
    try:
        size = path.stat().st_size
    except OSError:
        raise InputError(str(path), f"{what} file not found; pass an existing YAML file") from None
    if size > MAX_CONFIG_BYTES:
        raise InputError(str(path), f"{what} file is {size} bytes; the limit is {MAX_CONFIG_BYTES} (1 MiB)")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(where, f"invalid YAML ({problem})") from None
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
            raise InputError(f"--set {text}", "list indexes are not supported; replace the whole list, e.g. --set traffic.source.paths='[a.jsonl]'")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise InputError(f"--set {text}", f"the value is not valid YAML ({problem}); quote it for the shell") from None
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
        msg += f" (got {err['input']!r})"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more error{'s' if len(errors) > 2 else ''})"
    category = "invalid_config"
    if clean and kind != "extra_forbidden":  # a rejected value of these fields has its own category
        category = _FIELD_CATEGORY.get(clean[-1], category)
    return InputError(path, msg, category=category)


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
