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
from aisim.simulator.errors import RuntimeFailure
from aisim.simulator.metrics.summary import WALL_TIME_FIELDS
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
    # (auto on this 2-CPU cluster: one actor per CPU but the one the driver keeps for its share)
    assert "Runtime: ray, 2 engine host(s) (the driver and 1 actor(s))" in capsys.readouterr().out
    assert main(["predict", "--output-dir", str(tmp_path / "local")]) == 0
    assert prediction(tmp_path / "ray") == prediction(tmp_path / "local")


@pytest.mark.parametrize("name", ["kv_router_4", "planner_disaggregated", "sglang_dp", "sglang_2p2d",
                                  "offload_kv_router", "offload_shared", "mtp_kv_router_dp"])
def test_exact_lockstep_on_ray_equals_local(name):
    ray_run = replay(name, backend="ray", engine_actors=2)
    rt = ray_run.diagnostics["runtime"]
    assert rt["backend"] == "ray"
    if name.startswith("offload_shared"):  # (a shared KV tier is one state: one actor holds every worker)
        assert rt["num_hosts"] == 1 and "driver_hosts_workers" not in rt
    else:  # the driver's share, then the two actors'
        assert rt["num_hosts"] == 3 and rt["driver_hosts_workers"] is True and len(rt["host_busy_s"]) == 3
    assert same(replay(name), ray_run)


def test_without_the_driver_share_the_actors_hold_every_worker():
    ray_run = replay("kv_router_4", router_sync_ms=25, backend="ray", engine_actors=2, driver_hosts_workers=False)
    rt = ray_run.diagnostics["runtime"]
    assert rt["num_hosts"] == 2 and "driver_hosts_workers" not in rt and len(rt["host_busy_s"]) == 2
    assert same(replay("kv_router_4", router_sync_ms=25), ray_run)


def test_the_driver_share_is_a_config_key(tmp_path, capsys):
    assert main(["predict", "--backend", "ray", "--set", "execution.driver_hosts_workers=false",
                 "--set", "execution.engine_actors=1", "--output-dir", str(tmp_path / "ray")]) == 0
    assert "Runtime: ray, 1 engine host(s), " in capsys.readouterr().out


def test_a_window_on_ray_equals_the_same_window_in_process():
    assert same(replay("kv_router_dp", router_sync_ms=25),
                replay("kv_router_dp", router_sync_ms=25, backend="ray", engine_actors=2))


def test_a_host_that_fails_is_named_with_its_error_and_the_channel_stays_usable():
    from aisim.simulator.runtime.ray_runtime import RayRuntime
    from aisim.simulator.traffic.build import synthetic_workload

    rt = RayRuntime({}, synthetic_workload(1, 16, 1, 0), [], 1, {})
    try:
        with pytest.raises(RuntimeFailure, match=r"a Ray actor failed during an engine step: \w+Error"):
            rt.step({0: ([["spawn", 7, "nowhere"]], [])}, 0.0, 1.0)  # (a worker of an unknown pool)
        assert rt.step({0: ([], [])}, 1.0, 2.0)[0].reached == 2.0  # (the next call is answered)
        assert rt.num_nodes == 1
    finally:
        rt.close()


def test_a_dead_actor_is_one_clear_error_not_a_hang(ray_session):
    from aisim.simulator.runtime.ray_runtime import RayRuntime
    from aisim.simulator.traffic.build import synthetic_workload

    rt = RayRuntime({}, synthetic_workload(1, 16, 1, 0), [], 1, {})
    try:
        host = rt.hosts[0]
        pid = ray_session.get(host.__ray_call__.remote(lambda actor: os.getpid()))
        ray_session.kill(host)
        for _ in range(600):  # the kill is asynchronous: wait until the actor's process is gone
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        with pytest.raises(RuntimeFailure, match="actor died"):
            rt.step({0: ([], [])}, 0.0, 1.0)
    finally:
        rt.close()


def test_what_ray_prints_for_a_dead_actor_never_reaches_stdout():
    """A worker killed under the driver (the OOM killer, a crash): Ray's ``(raylet) A worker died ...``
    line goes to stderr, so stdout stays aisim's own (``--format json``). In a child with its own Ray."""
    from tests.simulator.runtime.test_ray_start import RayEnv, reap

    ray_env = RayEnv()
    try:
        p = ray_env.run("""
            import io, json, os, signal, sys, time

            class Tee(io.TextIOBase):  # stderr, remembered: did Ray's line come (and where)?
                def __init__(self, stream):
                    self.stream, self.text = stream, []
                def write(self, s):
                    self.text.append(s)
                    return self.stream.write(s)
                def flush(self):
                    self.stream.flush()

            sys.stderr = tee = Tee(sys.stderr)
            from aisim.simulator.errors import RuntimeFailure
            from aisim.simulator.runtime.ray_runtime import RayRuntime
            from aisim.simulator.traffic.build import synthetic_workload

            def actor_pids():
                mark = ("AISIM_TEST_RAY=" + os.environ["AISIM_TEST_RAY"]).encode()
                out = []
                for d in filter(str.isdigit, os.listdir("/proc")):
                    try:
                        cmd = open(f"/proc/{d}/cmdline", "rb").read()
                        env = open(f"/proc/{d}/environ", "rb").read().split(b"\\0")
                    except OSError:
                        continue
                    if cmd.startswith(b"ray::EngineHostActor") and mark in env:
                        out.append(int(d))
                return out

            rt = RayRuntime({}, synthetic_workload(1, 16, 1, 0), [], 1, {})
            ray, failure = rt.ray, None
            try:
                host = rt.hosts[0]
                (pid,) = actor_pids()
                os.kill(pid, signal.SIGKILL)  # not ray.kill: an unexpected death, which the raylet reports
                for _ in range(600):
                    try:
                        ray.get(host.ready.remote(), timeout=10)
                    except ray.exceptions.RayActorError:
                        break
                    time.sleep(0.05)
                try:
                    rt.step({0: ([], [])}, 0.0, 1.0)
                except RuntimeFailure as exc:
                    failure = str(exc)
                for _ in range(600):  # the raylet's line comes asynchronously
                    if "(raylet)" in "".join(tee.text):
                        break
                    time.sleep(0.1)
            finally:
                rt.close()
            sys.stdout.write(json.dumps({"failure": failure, "raylet_line": "(raylet)" in "".join(tee.text)}) + "\\n")
        """, timeout=300)
    finally:
        left = reap(ray_env.mark)
        import shutil

        shutil.rmtree(ray_env.dir, ignore_errors=True)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout  # nothing but the child's own line
    doc = json.loads(lines[0])
    assert "actor died" in doc["failure"]
    assert doc["raylet_line"] and "(raylet)" in p.stderr and "worker died" in p.stderr
    assert not left, f"Ray processes left behind: {left}"


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
