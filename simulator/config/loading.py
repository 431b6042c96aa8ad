"""Load a predict YAML, apply ``--set`` overrides, validate once, render errors as one line."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import ValidationError

from aisim.simulator.config.models import PredictConfig
from aisim.simulator.config.paths import deep_copy, set_path
from aisim.simulator.errors import InputError

_UNION_PARENTS = {("traffic", "source"), ("traffic", "load")}
_YAML_NAMES = ("MAX_CONFIG_BYTES", "MAX_YAML_NODES", "DuplicateKeyError", "TooLargeError", "ConfigLoader", "load_yaml",
               "read_yaml_mapping", "parse_override")


def __getattr__(name: str):
    """The YAML readers (``yaml_reader``), imported on first use."""
    if name in _YAML_NAMES:
        from aisim.simulator.config import yaml_reader

        return getattr(yaml_reader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def apply_overrides(data: dict, overrides: list[str]) -> dict:
    """Apply overrides left to right on a copy (``data`` is not changed); missing intermediate
    mappings are created."""
    from aisim.simulator.config.yaml_reader import parse_override

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
    from aisim.simulator.config.yaml_reader import read_yaml_mapping

    src = path if path is not None else default_path
    if src is None:
        raise InputError("--config", "no config given")
    data = read_yaml_mapping(src)
    data = apply_overrides(data, overrides or [])
    return validate_config(data), src.resolve().parent
