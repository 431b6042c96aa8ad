"""AISIM_* environment settings are validated like config keys: one line naming the variable,
read when they are needed (importing a module never fails on one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from aisim.simulator.config.env import env_float
from aisim.simulator.errors import InputError
from tests.conftest import ROOT

CALL = "AISIM_RAY_CALL_TIMEOUT_S"


@pytest.mark.parametrize("raw", ["abc", "-1", "0", "nan", "inf", "1s"])
def test_a_bad_value_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(CALL, raw)
    with pytest.raises(InputError) as info:
        env_float(CALL, 600.0)
    e = info.value
    assert e.where == CALL and e.exit_code == 2 and e.category == "invalid_config"
    assert e.message == f"must be a number of seconds > 0, got {raw!r}"


def test_unset_empty_and_good_values(monkeypatch):
    monkeypatch.delenv(CALL, raising=False)
    assert env_float(CALL, 600.0) == 600.0
    monkeypatch.setenv(CALL, " ")
    assert env_float(CALL, 600.0) == 600.0
    monkeypatch.setenv(CALL, " 2.5 ")
    assert env_float(CALL, 600.0) == 2.5
    monkeypatch.setenv(CALL, "0")
    assert env_float(CALL, 1.0, inclusive=True) == 0.0


def test_the_ray_timeouts_are_read_when_asked(monkeypatch):
    from aisim.simulator.runtime import ray_runtime

    monkeypatch.setenv(CALL, "7")
    monkeypatch.setenv("AISIM_RAY_START_TIMEOUT_S", "abc")
    assert ray_runtime.call_timeout_s() == 7.0
    with pytest.raises(InputError, match="AISIM_RAY_START_TIMEOUT_S: must be a number of seconds > 0, got 'abc'"):
        ray_runtime.start_timeout_s()


def test_importing_never_fails_and_a_ray_runtime_fails_before_starting_ray(monkeypatch):
    code = "import aisim.simulator.runtime.ray_runtime; print('ok')"
    env = {"PATH": "/usr/bin:/bin", "HOME": "/root", CALL: "abc", "AISIM_RAY_START_TIMEOUT_S": "-1"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr

    from aisim.simulator.runtime import ray_runtime

    def no_ray(*a, **k):
        raise AssertionError("Ray must not start with a bad setting")

    monkeypatch.setattr(ray_runtime, "start_ray", no_ray)
    monkeypatch.setenv(CALL, "-1")
    with pytest.raises(InputError, match="AISIM_RAY_CALL_TIMEOUT_S: must be a number of seconds > 0, got '-1'"):
        ray_runtime.RayRuntime({}, None, [], None, {})
