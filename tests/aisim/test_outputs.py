"""The output directory as a transaction, as a user meets it: a run that is interrupted in any way
(SIGINT, SIGTERM, SIGKILL, while simulating or while writing) leaves the previous outputs byte for
byte as they were; two runs never write one directory at once; an unwritable directory is refused
before the run; files follow the umask; per-request records are stored once; an ASCII stdout gets an
ASCII table; rejected requests are reported."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aisim.simulator.errors import InputError
from aisim.simulator.metrics import output
from aisim.simulator.metrics.output import OutputTransaction
from tests.conftest import ROOT, SLICE

ENV = dict(os.environ, PYTHONPATH=str(ROOT))
# the KV cache holds 200 blocks of 64 tokens per rank: the longest prompts cannot fit (~1 in 10 rejected)
SOME_REJECTED = ["--set", "engine.workers.aggregated.kv_cache.capacity.blocks=200"]
ALL_REJECTED = ["--set", "engine.workers.aggregated.kv_cache.capacity.blocks=2"]


def aisim(*args, cwd=None, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "aisim", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env or ENV, timeout=300, **kw)


def start(*args, cwd=None):
    return subprocess.Popen([sys.executable, "-m", "aisim", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, cwd=cwd, env=ENV)


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1, stderr
    return stderr.strip()


def snapshot(directory: Path) -> dict:
    """Every entry below ``directory``: bytes (files), target (links), mode."""
    out = {}
    for p in sorted(directory.rglob("*")):
        st = p.lstat()
        content = os.readlink(p) if p.is_symlink() else None if p.is_dir() else p.read_bytes()
        out[str(p.relative_to(directory))] = (stat.S_IMODE(st.st_mode), content)
    return out


def siblings(out: Path) -> list[str]:
    """What aisim keeps next to ``out`` (staging, swapped-out directory, lock)."""
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.aisim-"))


def _repeated_slice(path: Path, times: int) -> Path:
    rows = [json.loads(line) for line in SLICE.read_text().splitlines()]
    with path.open("w") as fh:
        for k in range(times):
            for r in rows:
                fh.write(json.dumps({**r, "timestamp": r["timestamp"] + k * 340_000}) + "\n")
    return path


@pytest.fixture(scope="module")
def big_trace(tmp_path_factory) -> Path:
    """The bundled slice four times over (4,000 requests): a run long enough to signal mid-way."""
    return _repeated_slice(tmp_path_factory.mktemp("trace") / "big.jsonl", 4)


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory) -> Path:
    """The bundled slice sixteen times over (16,000 requests): a simulation that lasts seconds
    even on a fast machine (the 4,000-request run ends within a second on some)."""
    return _repeated_slice(tmp_path_factory.mktemp("trace") / "long.jsonl", 16)


@pytest.fixture(scope="module")
def previous_run(tmp_path_factory) -> Path:
    """A completed quickstart run with per-request records, plus a user's own file and folder."""
    out = tmp_path_factory.mktemp("prev") / "out"
    p = aisim("predict", "--output-dir", out, "--capture-per-request", "--format", "json")
    assert p.returncode == 0, p.stderr
    (out / "notes.txt").write_text("mine\n")
    (out / "plots").mkdir()
    (out / "plots" / "ttft.svg").write_text("<svg/>\n")
    return out


@pytest.fixture
def out(tmp_path, previous_run) -> Path:
    d = tmp_path / "out"
    shutil.copytree(previous_run, d, symlinks=True)
    return d


def wait_for(predicate, proc, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        assert proc.poll() is None, f"the run ended before the moment to signal it: {proc.returncode}"
        time.sleep(0.002)
    raise AssertionError("timed out waiting")


def writing_requests(out: Path, pid: int):
    staging = out.parent / f".{out.name}.aisim-tmp-{pid}"

    def check():
        try:
            return any(n.startswith(".requests.jsonl.") for n in os.listdir(staging))
        except OSError:
            return False
    return check


def big_run(out: Path, trace: Path, *extra):
    return start("predict", "--output-dir", out, "--overwrite", "--capture-per-request", "--per-request-in-prediction",
                 "--format", "json", "--set", f"traffic.source.paths=[{trace}]", *extra)


# --- interrupted runs --------------------------------------------------------------------------


@pytest.mark.parametrize("sig,code,word", [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")])
def test_a_signal_while_writing_keeps_the_previous_outputs(out, big_trace, sig, code, word):
    before = snapshot(out)
    proc = big_run(out, big_trace)
    wait_for(writing_requests(out, proc.pid), proc)  # mid-way through writing requests.jsonl
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert one_line(err) == f"aisim: {word}"
    assert snapshot(out) == before  # byte for byte, modes included; nothing deleted, nothing added
    assert siblings(out) == []  # no staging directory, no lock file


def test_sigint_during_the_simulation_keeps_the_previous_outputs(out, long_trace):
    before = snapshot(out)
    proc = big_run(out, long_trace)
    staging = out.parent / f".{out.name}.aisim-tmp-{proc.pid}"
    wait_for(staging.exists, proc)
    time.sleep(0.5)  # loading the trace, simulating (seconds of it)
    assert not os.listdir(staging)  # nothing written yet
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and one_line(err) == "aisim: interrupted"
    assert snapshot(out) == before and siblings(out) == []


def test_sigkill_while_writing_keeps_the_previous_outputs_and_blocks_nothing(out, big_trace):
    before = snapshot(out)
    proc = big_run(out, big_trace)
    wait_for(writing_requests(out, proc.pid), proc)
    proc.kill()
    proc.communicate(timeout=120)
    assert snapshot(out) == before  # the previous outputs are untouched
    left = siblings(out)
    assert f".out.aisim-tmp-{proc.pid}" in left  # the dead run's staging directory (and its lock file)
    # the directory still holds the previous outputs: without --overwrite it is (rightly) not empty
    assert "not empty" in one_line(aisim("predict", "--output-dir", out).stderr)
    p = aisim("predict", "--output-dir", out, "--overwrite", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert siblings(out) == []  # the leftovers of the killed run are gone
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "plots" / "ttft.svg").exists()
    assert not (out / "requests.jsonl").exists()  # an aisim output the new run did not write


def test_an_old_versions_temporary_file_does_not_block_the_next_run(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / ".prediction.json.k3j2h1.tmp").write_bytes(b"")  # what a killed older aisim left behind
    p = aisim("predict", "--output-dir", out, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["prediction.json", "resource-runtime.json"]


def test_interrupted_rename_pair_is_rolled_back_by_the_next_run(tmp_path, monkeypatch):
    """Without renameat2's exchange the swap is two renames; a run killed between them leaves the
    previous directory aside, and the next run puts it back before anything else."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    aside = tmp_path / f".out.aisim-old-{dead}"
    aside.mkdir()
    (aside / "prediction.json").write_text("{}\n")
    (tmp_path / f".out.aisim-tmp-{dead}").mkdir()  # its staging directory, complete or not
    tx = OutputTransaction(tmp_path / "out", overwrite=False)
    with pytest.raises(InputError, match="not empty"):
        tx.open()
    assert (tmp_path / "out" / "prediction.json").read_text() == "{}\n"
    assert siblings(tmp_path / "out") == []

    monkeypatch.setattr(output, "exchange_paths", lambda a, b: False)  # the two-rename path, completed
    with OutputTransaction(tmp_path / "out", overwrite=True) as tx:
        (tx.staging / "prediction.json").write_text('{"new": 1}\n')
        tx.commit()
    assert (tmp_path / "out" / "prediction.json").read_text() == '{"new": 1}\n'
    assert siblings(tmp_path / "out") == []


def test_a_failed_run_leaves_nothing(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    p = aisim("predict", "--output-dir", out, "--set", "traffic.source.paths=[/nonexistent.jsonl]")
    assert p.returncode == 2 and "not found" in one_line(p.stderr)
    assert list(tmp_path.iterdir()) == []  # not even the parent directories it created


# --- one run per directory ---------------------------------------------------------------------


def test_a_second_run_into_the_same_directory_exits_2_at_once(tmp_path, big_trace):
    out = tmp_path / "out"
    first = start("predict", "--output-dir", out, "--format", "json", "--set", f"traffic.source.paths=[{big_trace}]")
    wait_for(lambda: (tmp_path / f".out.aisim-tmp-{first.pid}").exists(), first)
    second = aisim("predict", "--output-dir", out, "--format", "json")
    assert second.returncode == 2 and second.stdout == ""  # refused before running
    err = one_line(second.stderr)
    assert str(out) in err and f"pid {first.pid}" in err and "in use" in err
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads((out / "prediction.json").read_text())["summary"]["num_requests"] == 4000  # the first run's
    assert sorted(f.name for f in out.iterdir()) == ["prediction.json", "resource-runtime.json"]
    assert siblings(out) == []


def test_a_held_lock_names_its_owner_and_a_dead_owners_lock_blocks_nothing(tmp_path):
    out = tmp_path / "out"
    lock = tmp_path / ".out.aisim-lock"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); os.write(fd, b'%d\\n' % os.getpid())\n"
        "print('locked', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        err = one_line(aisim("predict", "--output-dir", out).stderr)
        assert f"pid {holder.pid}" in err and str(out) in err
    finally:
        holder.kill()
        holder.wait()
    assert lock.read_text().strip() == str(holder.pid)  # a stale lock file of a dead process
    p = aisim("predict", "--output-dir", out, "--format", "json")
    assert p.returncode == 0, p.stderr
    assert siblings(out) == []  # released (and deleted) on exit


def test_the_lock_is_released_in_process(tmp_path):
    tx = OutputTransaction(tmp_path / "out", overwrite=False).open()
    with pytest.raises(InputError, match=f"in use by another aisim process \\(pid {os.getpid()}\\)"):
        OutputTransaction(tmp_path / "out", overwrite=False).open()
    tx.close()
    with OutputTransaction(tmp_path / "out", overwrite=False) as again:
        fd = os.open(tmp_path / ".out.aisim-lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        assert again.staging.is_dir()
    assert list(tmp_path.iterdir()) == []


# --- writability, placement ---------------------------------------------------------------------


def test_an_unwritable_output_directory_is_refused_before_the_run(tmp_path):
    (tmp_path / "file").write_text("")
    for bad in (tmp_path / "file" / "out", Path("/proc/aisim-out/run")):
        p = aisim("predict", "--output-dir", bad)
        assert p.returncode == 2 and p.stdout == "", p.stderr  # no table: it did not run
        assert str(bad) in one_line(p.stderr)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through permission bits")
def test_read_only_directories_are_refused_before_the_run(tmp_path, out):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    out.chmod(0o555)
    try:
        for args in (["--output-dir", ro / "out"], ["--output-dir", out, "--overwrite"]):
            p = aisim("predict", *args)
            assert p.returncode == 2 and p.stdout == "" and "cannot write" in one_line(p.stderr)
    finally:
        ro.chmod(0o755)
        out.chmod(0o755)


def test_the_working_directory_cannot_be_the_output_directory(tmp_path):
    p = aisim("predict", "--output-dir", ".", cwd=tmp_path)
    assert p.returncode == 2 and "working directory" in one_line(p.stderr)
    assert list(tmp_path.iterdir()) == []


# --- file modes ------------------------------------------------------------------------------------


@pytest.mark.parametrize("umask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)])
def test_outputs_follow_the_umask(tmp_path, umask, file_mode, dir_mode):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", out, "--capture-per-request", "--capture-worker-timeline", "--format",
              "json", "--set", "traffic.stop={max_virtual_time_seconds: 20}", preexec_fn=lambda: os.umask(umask))
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(out.stat().st_mode) == dir_mode
    files = list(out.iterdir())
    assert len(files) == 4 and all(stat.S_IMODE(f.stat().st_mode) == file_mode for f in files)


def test_overwrite_keeps_other_files_and_the_directory_mode(out):
    out.chmod(0o750)
    notes = (out / "notes.txt").stat()
    p = aisim("predict", "--output-dir", out, "--overwrite", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in out.iterdir()) == ["notes.txt", "plots", "prediction.json", "resource-runtime.json"]
    assert (out / "notes.txt").stat().st_ino == notes.st_ino  # the same file, not a copy
    assert (out / "plots" / "ttft.svg").read_text() == "<svg/>\n"
    assert stat.S_IMODE(out.stat().st_mode) == 0o750
    assert siblings(out) == []


# --- per-request records: one copy -------------------------------------------------------------------


def test_per_request_records_are_stored_once(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", out, "--capture-per-request", "--format", "json")
    assert p.returncode == 0, p.stderr
    pred = json.loads((out / "prediction.json").read_text())
    assert pred["per_request"] == {"path": "requests.jsonl", "records": 1000}
    assert pred["coverage"]["per_request_records"] == 1000
    rows = [json.loads(r) for r in (out / "requests.jsonl").read_text().splitlines()]
    assert len(rows) == 1000

    both = tmp_path / "both"
    p = aisim("predict", "--output-dir", both, "--capture-per-request", "--per-request-in-prediction", "--format", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads((both / "prediction.json").read_text())["per_request"] == rows
    assert (both / "requests.jsonl").read_bytes() == (out / "requests.jsonl").read_bytes()

    err = one_line(aisim("predict", "--output-dir", tmp_path / "x", "--per-request-in-prediction").stderr)
    assert "--per-request-in-prediction" in err and "--capture-per-request" in err


# --- stdout ----------------------------------------------------------------------------------------


def test_an_ascii_stdout_gets_an_ascii_table(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", out, env=dict(ENV, PYTHONIOENCODING="ascii"))
    assert p.returncode == 0 and p.stderr == ""
    assert p.stdout.isascii() and "| Time to First Token (ms)" in p.stdout and "+====" in p.stdout
    assert json.loads((out / "resource-runtime.json").read_text())["exit_code"] == 0
    p = aisim("predict", "--format", "json", env=dict(ENV, PYTHONIOENCODING="ascii"))
    assert p.returncode == 0 and json.loads(p.stdout)["completed_requests"] == 1000


def test_a_closed_stdout_is_a_failure_and_recorded_as_one(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "aisim", "predict", "--output-dir", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    proc.stdout.close()  # nobody reads the table
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 1
    assert "could not write the report to stdout" in one_line(err)
    rt = json.loads((out / "resource-runtime.json").read_text())
    assert (rt["status"], rt["exit_code"]) == ("failed", 1)
    assert (out / "prediction.json").exists()  # the report itself is complete


# --- rejected requests ---------------------------------------------------------------------------


def test_rejected_requests_warn_in_one_line(tmp_path):
    p = aisim("predict", "--format", "json", *SOME_REJECTED)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    rejected = summary["rejected_requests"]
    assert 0 < rejected < 1000 and summary["completed_requests"] > 0
    err = one_line(p.stderr)
    assert err.startswith(f"aisim predict: warning: {rejected:,} of 1,000 requests rejected")
    if "rejection_reasons" in summary:
        assert f"(kv_capacity {rejected:,}); see rejection_reasons" in err


def test_no_completed_request_is_a_failure_with_the_report_written(tmp_path):
    out = tmp_path / "out"
    p = aisim("predict", "--output-dir", out, "--format", "json", *ALL_REJECTED)
    assert p.returncode == 1
    err = one_line(p.stderr)
    assert err.startswith("aisim predict failed: no request completed (1,000 rejected")
    summary = json.loads(p.stdout)
    if "rejection_reasons" in summary:
        assert err == "aisim predict failed: no request completed (1,000 rejected: kv_capacity 1,000)"
    assert json.loads((out / "prediction.json").read_text())["summary"]["completed_requests"] == 0
    rt = json.loads((out / "resource-runtime.json").read_text())
    assert (rt["status"], rt["exit_code"]) == ("failed", 1) and rt["reason"].startswith("no request completed")


def test_an_unwritable_existing_directory_is_refused_before_anything(tmp_path, monkeypatch):
    """(Root writes through permission bits, so the check itself is simulated here.)"""
    target = tmp_path / "out"
    target.mkdir()
    (target / "prediction.json").write_text("{}\n")
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == target else real(p, mode, **kw))
    with pytest.raises(InputError, match=f"cannot write to output directory {target}"):
        OutputTransaction(target, overwrite=True).open()
    assert list(tmp_path.iterdir()) == [target] and (target / "prediction.json").read_text() == "{}\n"
