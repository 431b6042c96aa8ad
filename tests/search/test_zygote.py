"""search.zygote: local fan-out workers are forked from one zygote that imported the simulator;
they see the parent's environment and working directory as of their start, report their exit
status, and die with the zygote, which dies with the parent (tests/search/test_fanout.py kills a
parent)."""

from __future__ import annotations

import os
import signal

import pytest

from aisim.search import zygote
from aisim.search.fanout import fanout
from tests.search import tasks
from tests.search.test_fanout import wait_gone

pytestmark = pytest.mark.skipif(not zygote.available(), reason="workers start as fresh interpreters here (no pidfd)")


def test_workers_are_forked_by_the_zygote_with_the_parents_environment_now(tmp_path, monkeypatch):
    zygote.prepare()
    z = zygote.shared_zygote()
    monkeypatch.setenv("AISIM_ZYGOTE_TEST", "set after the zygote started")
    monkeypatch.chdir(tmp_path)
    with fanout("local", 2) as fo:
        out = fo.map(tasks.env_cwd_and_parent, ["AISIM_ZYGOTE_TEST"] * 2)
        assert out == [("set after the zygote started", str(tmp_path), z.proc.pid)] * 2
        assert zygote.shared_zygote() is z  # one zygote for every fan-out of the process


def test_a_killed_zygote_takes_its_workers_along_and_the_next_map_starts_another():
    with fanout("local", 2) as fo:
        assert fo.map(tasks.square, [1, 2]) == [1, 4]
        workers = fo.worker_pids()
        z = zygote.shared_zygote()
        os.kill(z.proc.pid, signal.SIGKILL)
        z.proc.wait()
        assert wait_gone(workers) == set()  # their death signal
        assert fo.map(tasks.square, [3, 4]) == [9, 16]  # dead workers replaced, from a new zygote
        assert zygote.shared_zygote() is not z
        assert not set(fo.worker_pids()) & set(workers)


def test_an_exit_status_comes_back_through_the_zygote():
    with fanout("local", 1) as fo:
        [died] = fo.map(tasks.hard_exit, [0])
        assert "exited with code 7 while running this item" in died.message
        [late] = fo.map(tasks.sleep_for, [30.0], item_timeout_s=0.5)
        assert late.status == "timeout"
        assert fo.map(tasks.square, [5]) == [25]


def test_a_zygote_whose_sources_changed_is_replaced_and_its_workers_kept(monkeypatch):
    zygote.prepare()
    old = zygote.shared_zygote()
    with fanout("local", 1) as first:
        [(_, _, parent)] = first.map(tasks.env_cwd_and_parent, ["HOME"])
        assert parent == old.proc.pid
        monkeypatch.setattr(zygote, "_sources_mtime", lambda: old.sources_mtime + 1.0)  # a file edited since
        with fanout("local", 1) as second:
            [(_, _, parent)] = second.map(tasks.env_cwd_and_parent, ["HOME"])
        new = zygote.shared_zygote()
        assert new is not old and parent == new.proc.pid
        assert old.alive() and first.map(tasks.square, [3]) == [9]  # the first fan-out's worker still runs
