"""The bundled configs work wherever the files are: from a copy of the repository at another path,
and from a wheel installed in a fresh virtual environment (offline: the environment borrows this
one's dependencies through a .pth file; only aisim comes from the wheel)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
ENV.update(RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
PREDICT_CONFIGS = ["quickstart.yaml", "aggregated-baseline.yaml", "disaggregated-1p1d.yaml",
                   "measured-qwen3-32b-fp8-h200.yaml", "planner-aggregated.yaml", "planner-aggregated-fp8.yaml",
                   "planner-disaggregated.yaml", "planner-disaggregated-fp8.yaml", "retune-router.yaml",
                   "retune-joint.yaml"]
SEARCH_CONFIGS = ["capacity-search.yaml", "spica-agg-vs-disagg.yaml", "spica-grid-16.yaml", "recommend-reference-form.yaml"]
SHORT = ["--set", "traffic.stop={max_virtual_time_seconds: 60}", "--format", "json"]


def run(python: str, args: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "aisim", *args], capture_output=True, text=True, cwd=cwd,
                          env=env or ENV, timeout=300)


def test_configs_run_from_a_copy_of_the_repository_elsewhere(tmp_path):
    copy = tmp_path / "elsewhere" / "aisim-copy"
    shutil.copytree(ROOT / "configs", copy / "configs")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = dict(ENV)
    for name in PREDICT_CONFIGS + SEARCH_CONFIGS:
        p = run(sys.executable, ["validate", "-c", str(copy / "configs" / name), "--format", "json"], elsewhere, env)
        assert p.returncode == 0, (name, p.stderr)
    for name in ("quickstart.yaml", "planner-aggregated.yaml", "disaggregated-1p1d.yaml"):
        p = run(sys.executable, ["predict", "-c", str(copy / "configs" / name), *SHORT], elsewhere, env)
        assert p.returncode == 0, (name, p.stderr)
        assert json.loads(p.stdout)["completed_requests"] > 0


def test_a_wheel_in_a_fresh_venv_runs_the_bundled_configs(tmp_path):
    setuptools = pytest.importorskip("setuptools", reason="building the wheel offline needs setuptools in this environment")
    if tuple(int(x) for x in setuptools.__version__.split(".")[:2]) < (70, 1):
        pytest.skip("building the wheel offline needs setuptools >= 70.1 (its own bdist_wheel); the test extra has it")
    import zipfile

    sys.path.insert(0, str(ROOT / "scripts"))
    from _trees import build_wheel, install_wheel  # (how the comparison scripts install a tree, too)

    # the build in a copy of the tree: a build leaves build/ and egg-info behind
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "__pycache__", "*.egg-info", "build", "out",
                                                              ".pytest_cache", "planner_reports"))
    wheel = build_wheel(src, tmp_path / "dist", env=ENV)
    py, site = install_wheel(wheel, tmp_path / "venv")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    # one import namespace: the wheel adds aisim (and its metadata) to site-packages, nothing else
    with zipfile.ZipFile(wheel) as z:
        top = {name.split("/")[0] for name in z.namelist()}
    assert top == {"aisim", "aisim-0.1.0.dist-info"}, top
    # every data file of the package's folders is in it (a missing hf_quant_config.json priced FP8 as BF16)
    tracked = subprocess.run(["git", "ls-files", "simulator", "actors", "search", "configs"], capture_output=True,
                             text=True, cwd=ROOT, check=True).stdout.split()
    with zipfile.ZipFile(wheel) as z:
        packed = set(z.namelist())
    missing = [f for f in tracked if f"aisim/{f}" not in packed and "/__pycache__/" not in f]
    assert tracked and missing == [], missing
    probe = ("import importlib.util as u, aisim.simulator, aisim.actors, aisim.search, aisim.configs;"
             "print(aisim.simulator.__file__); print(aisim.configs.__file__);"
             "print(*[n for n in ('simulator', 'actors', 'search', 'configs') if u.find_spec(n)])")
    where = subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=elsewhere, env=ENV)
    assert where.returncode == 0, where.stderr
    lines = where.stdout.splitlines()
    assert len(lines) == 3 and lines[0].startswith(site) and lines[1].startswith(site), lines  # from the wheel
    assert lines[2] == "", f"importable outside the aisim namespace: {lines[2]}"
    p = run(py, ["predict", "--format", "json"], elsewhere)  # the bundled quickstart
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["completed_requests"] == 1000
    installed = Path(site) / "aisim" / "configs"
    for name in PREDICT_CONFIGS + SEARCH_CONFIGS:
        p = run(py, ["validate", "-c", str(installed / name), "--format", "json"], elsewhere)
        assert p.returncode == 0, (name, p.stderr)
    p = run(py, ["predict", "-c", str(installed / "planner-aggregated.yaml"), *SHORT], elsewhere)
    assert p.returncode == 0, p.stderr


def test_every_module_is_imported_under_the_aisim_namespace_only():
    """Importing every module of the package leaves no second copy under a folder name
    (``simulator.x`` beside ``aisim.simulator.x``), and the facade names resolve."""
    import importlib
    import pkgutil

    import aisim

    skip = {"aisim.__main__"}
    for info in pkgutil.walk_packages(aisim.__path__, "aisim."):
        if info.name not in skip:
            importlib.import_module(info.name)
    for sub in ("simulator", "actors", "search", "configs"):
        for info in pkgutil.walk_packages(importlib.import_module(f"aisim.{sub}").__path__, f"aisim.{sub}."):
            importlib.import_module(info.name)
    stray = sorted(n for n in sys.modules if n.split(".")[0] in {"simulator", "actors", "search", "configs"})
    assert stray == []
    assert all(getattr(aisim, name) is not None for name in aisim.__all__)
