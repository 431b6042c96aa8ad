"""One replay over a two-node Ray cluster (two raylets on 127.0.0.1): engine actors on both nodes,
the same report as in process."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.simulator.runtime.test_ray_start import free_port, ray_env, reap, stop  # noqa: F401 - ray_env: a fixture

pytestmark = pytest.mark.slow


def _start(env, log_name: str, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--node-ip-address", "127.0.0.1",
           "--num-cpus", "1", "--disable-usage-stats", "--dashboard-agent-listen-port", str(free_port()), *args]
    with open(env.dir / log_name, "w") as log:  # (the child keeps its own copy of the descriptor)
        return subprocess.Popen(cmd, env=env.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.fixture
def two_nodes(ray_env):  # noqa: F811 - the fixture imported above
    """A head and a second node, one CPU each: (RayEnv, address)."""
    ray_env.env["RAY_AUTH_MODE"] = "disabled"  # (this Ray asks a joining node for the head's token otherwise)
    port = free_port()
    nodes = [_start(ray_env, "head.log", "--head", "--port", str(port), "--include-dashboard", "false",
                    "--temp-dir", str(ray_env.dir / "ray"))]
    try:
        check = f"import ray; ray.init(address='127.0.0.1:{port}'); print(sum(n['Alive'] for n in ray.nodes()))"
        end = time.monotonic() + 180
        while True:  # the head answers, then the second node joins it
            assert nodes[0].poll() is None, (ray_env.dir / "head.log").read_text()[-3000:]
            p = ray_env.run(check, timeout=60)
            if p.returncode == 0 and p.stdout.strip() == "1":
                break
            assert time.monotonic() < end, p.stderr[-3000:]
            time.sleep(1)
        nodes.append(_start(ray_env, "node.log", "--address", f"127.0.0.1:{port}"))
        while ray_env.run(check, timeout=60).stdout.strip() != "2":
            assert nodes[1].poll() is None, (ray_env.dir / "node.log").read_text()[-3000:]
            assert time.monotonic() < end, "the second node did not join"
            time.sleep(1)
        yield ray_env, f"127.0.0.1:{port}"
    finally:
        for n in reversed(nodes):
            stop(n, wait_s=30)
        reap(ray_env.mark, wait_s=10)


def test_one_replay_spreads_its_engine_actors_over_two_nodes(two_nodes):
    env, address = two_nodes
    p = env.run(f"""
        import json
        from aisim import run_trace_replay
        from tests.conftest import SLICE

        kw = dict(extra_engine_args={{"num_gpu_blocks": 4000}}, num_workers=8, router_mode="kv_router",
                  router_sync_ms=10, engine_actors=2)
        on_ray = run_trace_replay(str(SLICE), backend="ray", ray_address={address!r}, **kw)
        here = run_trace_replay(str(SLICE), **kw)
        wall = ("wall_time_ms", "processed_tokens_per_s", "processed_output_tokens_per_s")
        same = all(on_ray.summary[k] == here.summary[k] for k in here.summary if k not in wall)
        print(json.dumps({{"runtime": on_ray.diagnostics["runtime"], "same": same,
                          "completed": on_ray.summary["completed_requests"]}}))
    """, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["runtime"]["backend"] == "ray" and out["runtime"]["num_hosts"] == 3  # (the driver's share, 2 actors)
    assert out["runtime"]["driver_hosts_workers"] is True
    assert out["runtime"]["num_nodes"] == 2  # (one engine actor on each node: SPREAD, one CPU each)
    assert out["same"] and out["completed"] == 1000
