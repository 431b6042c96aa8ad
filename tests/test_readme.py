"""Every ``aisim`` command in README.md's code blocks that names a bundled config is one the command
line accepts: its flags parse (``--help`` level), the config exists, and it is of the kind the
command runs (a predict config for predict, a search config for recommend, ...)."""

from __future__ import annotations

import re
import shlex

import pytest

from aisim.cli import _build_parser
from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping
from aisim.validate import detect_kind
from tests.conftest import ROOT

README = ROOT / "README.md"


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, body)`` of every fenced block."""
    blocks, body, lang = [], None, ""
    for line in text.splitlines():
        if line.startswith("```"):
            if body is None:
                body, lang = [], line[3:].strip()
            else:
                blocks.append((lang, "\n".join(body) + "\n"))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def code_blocks(text: str) -> list[str]:
    """The bodies of the fenced blocks that are not Python or YAML (shell commands and their output)."""
    return [body for lang, body in fenced_blocks(text) if lang not in ("python", "yaml", "json")]


def readme_commands() -> list[str]:
    """The ``aisim ...`` commands of the README's code blocks (continuation lines joined, comments
    and output lines dropped) that name a file under configs/."""
    out = []
    for block in code_blocks(README.read_text(encoding="utf-8")):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.strip()
            if not line.startswith("aisim ") or "configs/" not in line:
                continue
            try:
                words = shlex.split(line, comments=True)
            except ValueError:  # an unbalanced quote: not a command
                continue
            for op in (">", ">>", "|", "&&", ";", "2>&1"):
                if op in words:
                    words = words[:words.index(op)]
            if any(w.startswith("configs/") for w in words):
                out.append(" ".join(shlex.quote(w) for w in words))
    return out


COMMANDS = readme_commands()


def test_the_readme_names_bundled_configs():
    assert len(COMMANDS) >= 8 and any("recommend" in c for c in COMMANDS) and any("capacity" in c for c in COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_parses_and_names_a_bundled_config_of_its_kind(command):
    words = shlex.split(command)[1:]
    args = _build_parser().parse_args(words)  # exits 2 on a flag the command does not take
    config = getattr(args, "config", None)
    if config is None or args.command not in ("predict", "recommend", "capacity", "validate"):
        return
    path = ROOT / config
    assert path.is_file(), f"{command}: {config} is not a bundled config"
    data = apply_overrides(read_yaml_mapping(path, "config"), list(getattr(args, "overrides", []) or []))
    if args.command != "validate":
        assert detect_kind(data) == args.command, f"{command}: {config} is a {detect_kind(data)} config"


def test_the_readme_python_examples_import_from_the_aisim_namespace():
    """Every import of the README's Python examples names aisim (or the standard library) and
    resolves: the names exist where the README says."""
    import ast
    import importlib
    import sys

    blocks = [body for lang, body in fenced_blocks(README.read_text(encoding="utf-8")) if lang == "python"]
    assert len(blocks) >= 4
    for block in blocks:
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom):
                root = node.module.split(".")[0]
                assert root == "aisim" or root in sys.stdlib_module_names, node.module
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert getattr(module, alias.name, None) is not None, f"{node.module}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    root = alias.name.split(".")[0]
                    assert root == "aisim" or root in sys.stdlib_module_names, alias.name
                    importlib.import_module(alias.name)
