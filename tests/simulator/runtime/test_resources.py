"""Host limits enforced while they matter: the memory limit from start-up (loading included), the
initialisation timeout as a bound (not a check afterwards), both as one clear error, with a last
resort when the main thread does not answer. No wall-clock assertions: the children that must end
early would otherwise sleep far past their subprocess guard."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from aisim.simulator.errors import InitTimeoutError, ResourceLimitError
from aisim.simulator.runtime.resources import (
    InitWatchdog,
    LimitSignal,
    ResourceGuard,
    current_rss_bytes,
    peak_rss_bytes,
    set_phase,
)
from tests.conftest import ROOT

MB = 1_000_000


def child(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=str(ROOT))


def grow(hold: list, total: int, chunk: int = 4 * MB) -> None:
    """Allocate ``total`` bytes more, touched (resident), a chunk at a time (Python code between
    chunks, so a signal handler runs there)."""
    for _ in range(total // chunk):
        b = bytearray(chunk)
        b[::4096] = b"\1" * len(b[::4096])
        hold.append(b)


# -- memory -------------------------------------------------------------------------------
def test_a_check_over_the_limit_is_exit_code_3():
    with pytest.raises(ResourceLimitError) as info:
        ResourceGuard(1).check()
    assert info.value.exit_code == 3 and "memory_limit" in str(info.value)


def test_a_limit_below_the_interpreter_fails_at_start_naming_the_key_and_the_rss():
    before = signal.getsignal(signal.SIGALRM)
    rss = current_rss_bytes()
    guard = ResourceGuard(rss // 2, hard_exit=False)
    with pytest.raises(ResourceLimitError) as info:
        guard.start()
    msg = str(info.value)
    assert "execution.resources.memory_limit_gb" in msg and "needs to start" in msg and "resident already" in msg
    assert not guard.active and guard.peak_observed >= rss // 2
    assert signal.getsignal(signal.SIGALRM) == before  # nothing left installed


def test_memory_is_bounded_while_loading_not_only_during_the_replay():
    hold: list = []
    guard = ResourceGuard(current_rss_bytes() + 120 * MB, hard_exit=False)
    with pytest.raises(ResourceLimitError) as info:
        with guard:
            set_phase("loading the trace")
            grow(hold, 2000 * MB)  # far past the limit, if nothing stopped it
    allocated = sum(map(len, hold))
    hold.clear()
    assert allocated < 1000 * MB  # stopped near the limit, not after 2 GB
    assert "while loading the trace" in str(info.value) and "memory_limit" in str(info.value)
    assert guard.peak_observed > guard.limit_bytes  # the measured peak, for resource-runtime.json
    assert not guard.active


def test_except_exception_does_not_swallow_the_memory_limit():
    hold: list = []
    guard = ResourceGuard(current_rss_bytes() + 80 * MB, hard_exit=False)
    with pytest.raises(ResourceLimitError):
        with guard:
            for _ in range(500):
                try:  # a loader's "anything goes wrong: skip this row"
                    grow(hold, 4 * MB)
                except Exception:  # noqa: BLE001
                    pass
    hold.clear()


def test_the_peak_is_this_process_not_an_inherited_high_water_mark():
    hold: list = []
    grow(hold, 300 * MB)
    parent_maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    p = child("""
        import resource
        from aisim.simulator.runtime.resources import peak_rss_bytes
        print(peak_rss_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    """)
    hold.clear()
    assert p.returncode == 0, p.stderr
    peak, maxrss = map(int, p.stdout.split())
    assert parent_maxrss >= 300 * MB
    assert peak < 250 * MB  # ru_maxrss survives exec (maxrss may show the parent's), VmHWM does not
    assert peak_rss_bytes() >= current_rss_bytes()


def test_the_replay_starts_at_the_guards_next_check():
    calls = []
    guard = ResourceGuard(None)
    guard.on_next_check(lambda: calls.append(1))
    guard.check()
    guard.check()
    assert calls == [1]


def test_an_unresponsive_main_thread_still_ends_with_exit_code_3_and_the_record(tmp_path):
    record = tmp_path / "record.json"
    p = child(f"""
        import json, signal, time
        from aisim.simulator.runtime.resources import ResourceGuard, current_rss_bytes
        signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.SIGALRM}})  # as a C library might
        def record(err):
            with open({str(record)!r}, "w") as fh:
                json.dump({{"reason": str(err), "peak": guard.peak_observed, "limit": guard.limit_bytes}}, fh)
        guard = ResourceGuard(current_rss_bytes() + 60_000_000, on_hard_exit=record, label="aisim predict")
        guard.start()
        hold = []
        for _ in range(100):
            hold.append(bytearray(4_000_000))
            hold[-1][::4096] = bytes(len(hold[-1][::4096]))
        time.sleep(60)  # never reached the end: the guard ends the process
        print("not stopped")
    """)
    assert p.returncode == 3, (p.stdout, p.stderr)
    assert p.stdout == ""
    assert p.stderr.startswith("aisim predict: error: resident memory") and "memory_limit" in p.stderr
    doc = json.loads(record.read_text())
    assert doc["peak"] > doc["limit"] and "memory_limit" in doc["reason"]


# -- initialisation -----------------------------------------------------------------------
def test_a_hung_initialisation_is_stopped_at_the_limit():
    before = signal.getsignal(signal.SIGALRM)
    with pytest.raises(InitTimeoutError) as info:
        with InitWatchdog(0.5, hard_exit=False) as wd:
            wd.phase = "loading the trace"
            time.sleep(60)  # a hang; the watchdog interrupts it
    msg = str(info.value)
    assert info.value.exit_code == 124
    assert "initialisation took longer than" in msg and "initialization_timeout_seconds" in msg
    assert "still loading the trace" in msg
    assert signal.getsignal(signal.SIGALRM) == before


def test_except_exception_does_not_swallow_the_timeout():
    with pytest.raises(InitTimeoutError):
        with InitWatchdog(0.3, hard_exit=False):
            while True:  # Ray's "retry on any error" loops look like this
                try:
                    time.sleep(0.05)
                except Exception:  # noqa: BLE001
                    pass


def test_the_limit_counts_from_the_command_start():
    with pytest.raises(InitTimeoutError, match="initialisation took longer"):
        InitWatchdog(5.0, started_at=time.perf_counter() - 10.0, hard_exit=False).start()


def test_a_stopped_watchdog_never_fires():
    before = signal.getsignal(signal.SIGALRM)
    wd = InitWatchdog(0.2, hard_exit=False).start()
    wd.stop()
    time.sleep(0.5)  # past the limit: nothing happens
    assert wd.tripped is None and signal.getsignal(signal.SIGALRM) == before
    wd.stop()  # idempotent


def test_a_limit_signal_unwraps_to_its_error():
    err = InitTimeoutError("x")
    assert isinstance(LimitSignal(err), BaseException) and not isinstance(LimitSignal(err), Exception)
    assert LimitSignal(err).error is err


def test_an_unresponsive_main_thread_still_exits_124_in_one_line():
    p = child("""
        import signal, time
        from aisim.simulator.runtime.resources import InitWatchdog
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        wd = InitWatchdog(1.0, label="aisim predict").start()
        wd.phase = "starting a local Ray"
        time.sleep(60)
        print("not stopped")
    """)
    assert p.returncode == 124, (p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aisim predict: error: initialisation took longer than")
    assert "still starting a local Ray" in lines[0]
