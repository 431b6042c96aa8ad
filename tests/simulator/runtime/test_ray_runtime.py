"""The Ray runtime: workers, router and Planner as Ray actors give byte for byte what the
in-process runtime gives; failures are one clear line, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from aisim.cli import main
from simulator.errors import RuntimeFailure
from simulator.metrics.summary import WALL_TIME_FIELDS
from tests.conftest import ROOT
from tests.simulator.test_coordinator import replay, same

pytestmark = pytest.mark.usefixtures("ray_session")


def prediction(path) -> dict:
    doc = json.loads((path / "prediction.json").read_text())
    for k in WALL_TIME_FIELDS:
        doc["summary"].pop(k)
    return doc


def test_quickstart_on_ray_is_byte_identical_to_local(tmp_path, capsys):
    assert main(["predict", "--backend", "ray", "--output-dir", str(tmp_path / "ray")]) == 0
    assert "Runtime: ray" in capsys.readouterr().out
    assert main(["predict", "--output-dir", str(tmp_path / "local")]) == 0
    assert prediction(tmp_path / "ray") == prediction(tmp_path / "local")


@pytest.mark.parametrize("name", ["kv_router_4", "planner_disaggregated"])
def test_exact_lockstep_on_ray_equals_local(name):
    ray_run = replay(name, backend="ray", engine_actors=2)
    assert ray_run.diagnostics["runtime"]["backend"] == "ray"
    assert same(replay(name), ray_run)


def test_a_window_on_ray_equals_the_same_window_in_process():
    assert same(replay("kv_router_dp", router_sync_ms=25),
                replay("kv_router_dp", router_sync_ms=25, backend="ray", engine_actors=2))


def test_a_dead_actor_is_one_clear_error_not_a_hang(ray_session):
    from simulator.runtime.ray_runtime import RayRuntime
    from simulator.traffic.build import synthetic_workload

    rt = RayRuntime({}, synthetic_workload(1, 16, 1, 0), [], 1, {})
    try:
        host = rt.hosts[0]
        ray_session.kill(host)
        for _ in range(300):  # the kill is asynchronous: wait until the actor is gone
            try:
                ray_session.get(host.ready.remote(), timeout=10)
            except ray_session.exceptions.RayActorError:
                break
            time.sleep(0.05)
        with pytest.raises(RuntimeFailure, match="actor died"):
            rt.step({0: ([], [])}, 0.0, 1.0)
    finally:
        rt.close()


def test_ray_that_cannot_start_fails_in_one_line_with_nothing_written(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "aisim", "predict", "--ray-address", "127.0.0.1:1",
                        "--output-dir", str(out)], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "could not join the Ray cluster at '127.0.0.1:1'" in p.stderr
    assert not (out / "prediction.json").exists()


def test_ray_address_needs_the_ray_backend(capsys):
    assert main(["predict", "--backend", "local", "--ray-address", "auto"]) == 2
    assert "ray_address needs backend: ray" in capsys.readouterr().err
