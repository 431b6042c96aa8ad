"""How aisim starts or joins Ray: a local backend always starts its own fresh Ray (never a cluster
named by a leftover address file or RAY_ADDRESS), ``auto`` says where a dead address came from,
a cluster that wants token authentication is named as such, a start that hangs is bounded by
the initialisation timeout and leaves no process behind.

Every Ray here lives in a child process with its own temp dir (TMPDIR) and home, its processes
marked through their environment (``AISIM_TEST_RAY``) so that each test finds and ends only its
own; the session's Ray (``ray_session``) is never touched."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT


# -- helpers (also used by test_ray_runtime.py) ----------------------------------------------
def marked_pids(mark: str) -> list[int]:
    """Live processes whose environment holds ``AISIM_TEST_RAY=mark`` (what one test started)."""
    needle = f"AISIM_TEST_RAY={mark}".encode()
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if needle in env:
            out.append(int(d))
    return out


def reap(mark: str, wait_s: float = 30.0) -> list[int]:
    """Wait (bounded) for a test's processes to end; kill by id any still there. Returns those."""
    end = time.monotonic() + wait_s
    while marked_pids(mark) and time.monotonic() < end:
        time.sleep(0.2)
    left = marked_pids(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left


def stop(proc: subprocess.Popen, wait_s: float = 20) -> None:
    """SIGTERM, then SIGKILL when it has not ended within ``wait_s``."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayEnv:
    """A child's environment: own TMPDIR (Ray's temp dir and address file, short for Ray's socket
    paths), own HOME (no ~/.ray/auth_token), no RAY_ADDRESS / RAY_AUTH_*, a process mark."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="aisim-ray-", dir="/tmp"))
        self.mark = secrets.token_hex(8)
        home = self.dir / "home"
        home.mkdir()
        (home / "ray_bootstrap_config.yaml").write_text("")
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RAY_ADDRESS", "RAY_AUTH", "RAY_TMPDIR"))}
        self.env.update(TMPDIR=str(self.dir), HOME=str(home), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0",
                        AISIM_TEST_RAY=self.mark)

    @property
    def address_file(self) -> Path:
        return self.dir / "ray" / "ray_current_cluster"

    def run(self, code: str, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", textwrap.dedent(code)] if code else [sys.executable, *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=env or self.env, timeout=timeout,
                              cwd=str(ROOT))

    def aisim(self, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return self.run("", "-m", "aisim", *args, env=env, timeout=timeout)


@pytest.fixture
def ray_env():
    """A ``RayEnv``; afterwards none of its processes may be left (those that are get killed)."""
    e = RayEnv()
    try:
        yield e
    finally:
        left = reap(e.mark)
        shutil.rmtree(e.dir, ignore_errors=True)
    assert not left, f"Ray processes left behind: {left}"


# -- a local backend starts its own Ray ------------------------------------------------------
def test_a_local_start_ignores_a_stale_address_file_and_RAY_ADDRESS(ray_env):
    dead = free_port()  # nothing listens there any more: a cluster that died
    ray_env.address_file.parent.mkdir(parents=True)
    ray_env.address_file.write_text(f"127.0.0.1:{dead}\n")
    env = dict(ray_env.env, RAY_ADDRESS=f"127.0.0.1:{dead}")
    p = ray_env.run("""
        import json, os
        from aisim.simulator.runtime.ray_runtime import start_ray
        ray, started = start_ray(None)
        info = {"started": started, "gcs": ray.get_runtime_context().gcs_address,
                "cpus": ray.cluster_resources().get("CPU"), "RAY_ADDRESS": os.environ.get("RAY_ADDRESS")}
        ray.shutdown()
        print(json.dumps(info))
    """, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    info = json.loads(p.stdout.strip().splitlines()[-1])
    assert info["started"] and info["cpus"] >= 1
    assert not info["gcs"].endswith(f":{dead}")  # a fresh instance, not the dead one
    assert info["RAY_ADDRESS"] == f"127.0.0.1:{dead}"  # set aside for the start only


def test_auto_names_the_stale_address_file_it_read(ray_env):
    dead = free_port()
    ray_env.address_file.parent.mkdir(parents=True)
    ray_env.address_file.write_text(f"127.0.0.1:{dead}\n")
    p = ray_env.aisim("predict", "--ray-address", "auto")
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1, p.stderr
    assert f"127.0.0.1:{dead}" in err[0] and str(ray_env.address_file) in err[0] and "nothing answers" in err[0]
    assert "ray start --head" in err[0]


def test_auto_names_RAY_ADDRESS_when_that_is_where_the_address_came_from(ray_env):
    dead = free_port()
    p = ray_env.aisim("predict", "--ray-address", "auto", env=dict(ray_env.env, RAY_ADDRESS=f"127.0.0.1:{dead}"))
    assert p.returncode == 1, p.stderr
    err = p.stderr.strip().splitlines()
    assert len(err) == 1 and "from RAY_ADDRESS" in err[0] and "unset RAY_ADDRESS" in err[0], p.stderr


# -- a hung start is bounded, and leaves nothing behind --------------------------------------
@pytest.mark.parametrize("main_thread", ["responsive", "deaf"])
def test_a_hung_local_start_ends_at_the_init_timeout_with_nothing_left(ray_env, main_thread):
    """``deaf``: SIGALRM blocked (as a C library might), so the watchdog's last resort ends it (its limit
    is well past Ray's start, so that nothing is still being started when it ends what was)."""
    p = ray_env.run("""
        import os, signal, sys, time
        import ray._private.node as node

        if os.environ["AISIM_TEST_ARG"] == "deaf":
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})

        started = node.Node.__init__
        def hangs(self, *a, **k):  # Ray's processes start, then the start never finishes
            started(self, *a, **k)
            time.sleep(600)
        node.Node.__init__ = hangs

        from aisim.simulator.errors import InitTimeoutError
        from aisim.simulator.runtime.ray_runtime import start_ray
        from aisim.simulator.runtime.resources import InitWatchdog
        try:
            with InitWatchdog(5.0 if os.environ["AISIM_TEST_ARG"] == "responsive" else 20.0, label="aisim predict"):
                start_ray(None)
        except InitTimeoutError as exc:
            sys.stderr.write(f"aisim predict: error: {exc}\\n")
            sys.exit(exc.exit_code)
        print("started")
    """, env=dict(ray_env.env, AISIM_TEST_ARG=main_thread), timeout=300)
    assert p.returncode == 124, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("aisim predict: error: initialisation took longer than") and "starting a local Ray" in last
    assert p.stdout == ""
    # the fixture checks that none of the Ray processes it started outlived it


# -- token authentication --------------------------------------------------------------------
@pytest.fixture
def token_cluster(ray_env):
    """A ``ray start --head`` with token authentication on 127.0.0.1: (RayEnv, address, token)."""
    token = secrets.token_hex(16)
    port = free_port()
    cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", str(port),
           "--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--include-dashboard", "false",
           "--disable-usage-stats", "--temp-dir", str(ray_env.dir / "ray"),
           "--dashboard-agent-listen-port", str(free_port())]
    log = open(ray_env.dir / "head.log", "w")
    head = subprocess.Popen(cmd, env=dict(ray_env.env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while True:
            assert head.poll() is None, (ray_env.dir / "head.log").read_text()[-3000:]
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, "the head did not come up"
                time.sleep(0.5)
        yield ray_env, f"127.0.0.1:{port}", token
    finally:
        stop(head)
        log.close()
        reap(ray_env.mark, wait_s=10)  # its raylet, GCS, ... (killed by id where still there)


def test_joining_a_token_cluster_without_a_token_names_token_authentication(token_cluster):
    ray_env, address, token = token_cluster
    p = ray_env.aisim("predict", "--ray-address", address)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert f"the Ray cluster at {address} requires token authentication (InvalidAuthToken)" in last
    assert "RAY_AUTH_MODE=token" in last and "RAY_AUTH_TOKEN" in last and "README" in last

    wrong = dict(ray_env.env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    p = ray_env.aisim("predict", "--ray-address", address, env=wrong)
    assert p.returncode == 1, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "rejected this machine's authentication token (InvalidAuthToken)" in last

    right = dict(ray_env.env, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token)
    p = ray_env.run(f"""
        from aisim.simulator.runtime.ray_runtime import start_ray
        ray, started = start_ray({address!r})
        print(int(ray.cluster_resources().get("CPU", 0)))
        ray.shutdown()
    """, env=right)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "1"  # joined the head (1 CPU), as the README says


def test_an_auth_refusal_is_found_in_rays_chained_errors():
    from aisim.simulator.runtime.ray_runtime import _is_auth_error

    class AuthenticationError(Exception):
        pass

    try:
        try:
            raise RuntimeError("Failed to connect to GCS. Last connection error: Traceback ...\n"
                               "ray.exceptions.AuthenticationError: RPC error: InvalidAuthToken: Authentication "
                               "token is missing or incorrect.")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from inner
    except ConnectionError as exc:
        chained = exc
    assert _is_auth_error(chained)
    assert _is_auth_error(AuthenticationError("x"))
    assert not _is_auth_error(ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379"))
