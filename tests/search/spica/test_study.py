"""A Spica study is never damaged: a second run of an existing search is refused unless resumed,
two live runs never share a study (the output directory is locked, the search is claimed in its
storage, a dead run's claim is taken over), a resume replays the uninterrupted search's candidates
(random sampler), and a search resumes from its storage and name alone."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
import yaml

from aisim.search.spica.loop import STUDY_FILE, resume_search, run_search
from aisim.search.spica.study import CLAIM_ATTR, Claim, Location, find_search, locate
from aisim.simulator.errors import InputError
from aisim.simulator.metrics.output import lock_output_dir
from tests.conftest import ROOT
from tests.search.spica.test_loop import SEARCH, config

ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def configs_of(result_or_rec) -> set[str]:
    rec = getattr(result_or_rec, "recommendation", result_or_rec)
    return {json.dumps(c["config"], sort_keys=True) for c in rec["candidates"]}


def trials(storage, name="t-agg"):
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def test_a_second_run_of_an_existing_search_is_refused_and_appends_nothing(tmp_path):
    run_search(config(optimizer__max_trials=2), tmp_path, parallelism=1)
    journal = tmp_path / STUDY_FILE
    before = journal.read_bytes()
    with pytest.raises(InputError) as err:
        run_search(config(optimizer__max_trials=2), tmp_path, parallelism=1)
    assert err.value.where == "study" and "already exists" in err.value.message
    assert "--resume" in err.value.message and "2 trials" in err.value.message
    assert journal.read_bytes() == before  # the ledger is never appended twice
    r = run_search(config(optimizer__max_trials=3), tmp_path, parallelism=1, resume=True)
    assert r.resumed and r.counts["evaluated"] == 3
    ids = [c["candidate_id"] for c in r.recommendation["candidates"]]
    assert len(set(ids)) == 3
    r = run_search(config(optimizer__max_trials=1), tmp_path, parallelism=1, overwrite=True)
    assert r.counts["evaluated"] == 1 and not r.resumed
    with pytest.raises(InputError, match="cannot be combined"):
        run_search(config(), tmp_path, resume=True, overwrite=True)


def test_a_shared_storage_holds_one_search_per_name(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    a = run_search(config(optimizer__max_trials=2), tmp_path / "a", parallelism=1, storage=url)
    assert a.storage == url and not (tmp_path / "a" / STUDY_FILE).exists()
    with pytest.raises(InputError, match="already exists in sqlite:///"):
        run_search(config(optimizer__max_trials=2), tmp_path / "b", parallelism=1, storage=url)
    assert len(trials(url)) == 2
    # another name in the same storage is another search
    other = run_search(config(optimizer__max_trials=1, study__name="u"), tmp_path / "b", parallelism=1, storage=url)
    assert other.counts["evaluated"] == 1 and len(trials(url)) == 2


def test_the_cli_names_the_storage_and_refuses_with_exit_2(tmp_path):
    cfg = tmp_path / "s.yaml"
    data = json.loads(json.dumps(SEARCH))
    data["optimizer"]["max_trials"] = 1
    cfg.write_text(yaml.safe_dump(data))
    url = f"sqlite:///{tmp_path / 'x.db'}"
    cmd = [sys.executable, "-m", "aisim", "recommend", "-c", str(cfg), "--parallelism", "1", "--storage", url]
    p = subprocess.run(cmd + ["--output-dir", str(tmp_path / "a")], env=ENV, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"(study: {url})" in p.stdout and "study.journal" not in p.stdout
    p = subprocess.run(cmd + ["--output-dir", str(tmp_path / "b")], env=ENV, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "already exists" in p.stderr, p.stderr
    p = subprocess.run(cmd + ["--output-dir", str(tmp_path / "b"), "--storage", "x.db"], env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "--storage" in p.stderr and "journal" in p.stderr, p.stderr


def test_an_output_directory_in_use_is_refused(tmp_path):
    lock = lock_output_dir(tmp_path / "d")
    try:
        with pytest.raises(InputError, match=f"in use by another aisim process \\(pid {os.getpid()}\\)"):
            run_search(config(optimizer__max_trials=1), tmp_path / "d", parallelism=1)
        from aisim.search.capacity import run_capacity_search

        with pytest.raises(InputError, match="in use by another aisim process"):
            run_capacity_search(ROOT / "configs" / "capacity-search.yaml", tmp_path / "d")
    finally:
        lock.release()
    assert not list((tmp_path / "d").iterdir())  # nothing was written


def _slow_search(tmp_path, max_trials=16, request_count=400) -> str:
    data = json.loads(json.dumps(SEARCH))
    data["optimizer"]["max_trials"] = max_trials
    data["workload"]["request_count"] = request_count  # 400: a few tenths of a second a candidate
    path = tmp_path / "search.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _finished(journal) -> int:
    return journal.read_text().count('"record"') if journal.exists() else 0


def _start(cmd, cwd):
    return subprocess.Popen(cmd, env=ENV, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _wait_for(journal, n, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while _finished(journal) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()


def test_a_second_recommend_on_a_live_study_exits_2_and_the_first_finishes(tmp_path):
    cfg = _slow_search(tmp_path, max_trials=8, request_count=3000)
    url = f"sqlite:///{tmp_path / 'x.db'}"
    base = [sys.executable, "-m", "aisim", "recommend", "-c", cfg, "--parallelism", "1", "--format", "json"]
    first = _start(base + ["--output-dir", str(tmp_path / "a"), "--storage", url], tmp_path)
    deadline = time.monotonic() + 120
    claim = tmp_path / ".x.db.t.aisim-claim"  # held while the first runs the search
    while first.poll() is None and time.monotonic() < deadline and not claim.exists():
        time.sleep(0.05)
    second = [subprocess.Popen(base + ["--output-dir", str(tmp_path / d), "--storage", url, "--resume"], env=ENV,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in ("a", "b")]
    same_dir, other_dir = [(p.wait(timeout=60), p.communicate()[1]) for p in second]
    assert first.poll() is None  # both were refused while the first ran
    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err
    assert json.loads(out)["counts"]["evaluated"] == 8
    assert same_dir[0] == 2 and f"in use by another aisim process (pid {first.pid})" in same_dir[1], same_dir
    assert other_dir[0] == 2 and "being run by another aisim process" in other_dir[1], other_dir
    assert f"pid {first.pid}" in other_dir[1]
    # the first's study is whole: every trial finished, one candidate id each
    ts = trials(url)
    assert [t.state.name for t in ts] == ["COMPLETE"] * 8
    assert len({t.user_attrs["candidate_id"] for t in ts}) == 8
    assert all(not s.system_attrs.get(CLAIM_ATTR) for s in locate(url, tmp_path).open().get_all_studies())  # released


def test_a_claim_in_the_storage_is_refused_while_its_process_lives_and_taken_over_after(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    run_search(config(optimizer__max_trials=1), tmp_path / "a", parallelism=1, storage=url)
    storage = locate(url, tmp_path).open()
    found = find_search(storage, "t")
    sid = found.studies[0]._study_id
    where = Location(url, None, url, False)  # as a database server: the storage's claim alone
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import socket

        from aisim.search.spica.study import _start_time

        storage.set_study_system_attr(sid, CLAIM_ATTR, {"host": socket.gethostname(), "pid": live.pid,
                                                        "start": _start_time(live.pid), "token": "x",
                                                        "heartbeat": time.time()})
        with pytest.raises(InputError, match=f"pid {live.pid} on {socket.gethostname()}"):
            Claim(where, "t", 60).check(storage, found.studies)
        # the same pid reused by another process (another start time) is not the claimant
        storage.set_study_system_attr(sid, CLAIM_ATTR, {"host": socket.gethostname(), "pid": live.pid,
                                                        "start": "1", "token": "x", "heartbeat": time.time()})
        Claim(where, "t", 60).check(storage, found.studies)
        # another host: live while its heartbeat is recent, stale after
        storage.set_study_system_attr(sid, CLAIM_ATTR, {"host": "elsewhere", "pid": 1, "token": "y",
                                                        "heartbeat": time.time() - 30})
        with pytest.raises(InputError, match="pid 1 on elsewhere"):
            Claim(where, "t", 60).check(storage, found.studies)
        with pytest.raises(InputError, match="being run by another aisim process"):
            run_search(config(optimizer__max_trials=2), tmp_path / "b", parallelism=1, storage=url, resume=True)
        storage.set_study_system_attr(sid, CLAIM_ATTR, {"host": "elsewhere", "pid": 1, "token": "y",
                                                        "heartbeat": time.time() - 61})
        Claim(where, "t", 60).check(storage, found.studies)
    finally:
        live.kill()
        live.wait()
    dead = live.pid  # a dead process's claim is stale: the next run takes the study over
    storage.set_study_system_attr(sid, CLAIM_ATTR, {"host": socket.gethostname(), "pid": dead, "token": "z",
                                                    "heartbeat": time.time()})
    r = run_search(config(optimizer__max_trials=2), tmp_path / "b", parallelism=1, storage=url, resume=True)
    assert r.counts["evaluated"] == 2


def test_a_claim_taken_over_mid_run_stops_the_run():
    from aisim.search.spica.study import Claim

    class Store:
        attrs = {}

        def set_study_system_attr(self, sid, key, value):
            self.attrs[key] = value

        def get_study_system_attrs(self, sid):
            return dict(self.attrs)

    store = Store()
    claim = Claim(Location("postgresql://h/db", None, "postgresql://h/db", False), "t", 60)
    claim.take(store, [1])
    store.attrs[CLAIM_ATTR] = {**store.attrs[CLAIM_ATTR], "heartbeat": 0.0}  # (marks whether it is rewritten)
    claim.refresh()  # still ours; within a minute of the last write the heartbeat is left alone
    assert store.attrs[CLAIM_ATTR]["heartbeat"] == 0.0
    claim._beat -= 61  # a minute later (a long batch): the next tell renews it
    claim.refresh()
    assert store.attrs[CLAIM_ATTR]["heartbeat"] > time.time() - 5
    store.attrs[CLAIM_ATTR] = {**store.attrs[CLAIM_ATTR], "token": "other", "pid": 99}
    with pytest.raises(InputError, match="was taken over by pid 99"):
        claim.refresh()


def test_kill_and_resume_explores_the_same_candidates_as_the_uninterrupted_search(tmp_path):
    cfg = _slow_search(tmp_path, max_trials=9)
    whole = run_search(cfg, tmp_path / "whole", parallelism=1)
    assert whole.counts["evaluated"] == 9
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "aisim", "recommend", "-c", cfg, "--output-dir", str(out), "--parallelism", "1",
           "--format", "json"]
    proc = _start(cmd, tmp_path)
    _wait_for(out / STUDY_FILE, 5, proc)  # the second batch of four is in flight
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    p = subprocess.run(cmd + ["--resume"], env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["counts"]["evaluated"] == 9
    assert configs_of(rec) == configs_of(whole)  # the same points, the same winner
    winner = next(c for c in rec["candidates"] if c["candidate_id"] == rec["views"]["top_n"][0])
    assert winner["config"] == whole.best["config"]
    storage = locate(None, out).open()
    interrupted = [t for t in trials(storage) if t.state.name == "FAIL"]
    assert interrupted, "the kill left no trial in flight"
    for t in interrupted:  # failed with their candidate attributes
        assert t.user_attrs["status"] == "interrupted" and t.user_attrs["config"]["router_mode"] in (
            "round_robin", "kv_router") and t.user_attrs["params_key"]
    ids = [c["candidate_id"] for c in rec["candidates"]]
    assert len(ids) == len(set(ids)) == 9


def test_a_search_resumes_from_its_storage_and_name_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    first = run_search(config(optimizer__max_trials=3), tmp_path / "a", parallelism=1, storage=url)
    assert first.counts["evaluated"] == 3
    r = resume_search("t", url, max_trials=5, parallelism=1)  # no YAML, no SearchConfig
    assert r.resumed and r.counts["evaluated"] == 5 and r.output_dir == tmp_path / "a"
    assert configs_of(first) < configs_of(r)
    whole = run_search(config(optimizer__max_trials=5), tmp_path / "w", parallelism=1)
    assert configs_of(whole) == configs_of(r)
    # the default journal: the output directory names it
    run_search(config(optimizer__max_trials=2, study__name="j"), tmp_path / "j", parallelism=1)
    r = resume_search("j", output_dir=tmp_path / "j", max_trials=4, parallelism=1)
    assert r.counts["evaluated"] == 4 and r.storage == str(tmp_path / "j" / STUDY_FILE)
    with pytest.raises(InputError, match="no search 'nope'"):
        resume_search("nope", url)
    with pytest.raises(InputError, match="does not exist"):
        resume_search("t", str(tmp_path / "missing.journal"))


def test_resuming_with_another_config_is_refused_naming_the_difference(tmp_path):
    run_search(config(optimizer__max_trials=2), tmp_path, parallelism=1)
    with pytest.raises(InputError, match="started with another config \\(differs at workload.request_count\\)"):
        run_search(config(optimizer__max_trials=4, workload__request_count=50), tmp_path, resume=True, parallelism=1)
    # max_trials, parallelism and the timeout may change
    r = run_search(config(optimizer__max_trials=4, optimizer__candidate_timeout_seconds=300), tmp_path, resume=True,
                   parallelism=2)
    assert r.counts["evaluated"] == 4


def test_a_study_stored_before_an_optional_key_existed_resumes(tmp_path):
    from aisim.search.spica.study import SEARCH_ATTR, identity

    url = f"sqlite:///{tmp_path / 'x.db'}"
    run_search(config(optimizer__max_trials=2), tmp_path / "a", parallelism=1, storage=url)
    for name in optuna.get_all_study_names(url):  # (as a version without engine.backend_version stored it)
        study = optuna.load_study(study_name=name, storage=url)
        attrs = study.user_attrs[SEARCH_ATTR]
        assert attrs["config"]["engine"]["backend_version"] is None
        del attrs["config"]["engine"]["backend_version"]
        attrs["identity"] = identity(attrs["config"])
        study.set_user_attr(SEARCH_ATTR, attrs)
    r = run_search(config(optimizer__max_trials=3), tmp_path / "a", resume=True, parallelism=1, storage=url)
    assert r.counts["evaluated"] == 3
    with pytest.raises(InputError, match="differs at workload.request_count"):
        run_search(config(optimizer__max_trials=4, workload__request_count=50), tmp_path / "a", resume=True,
                   parallelism=1, storage=url)


def test_branches_are_asked_by_fewest_candidates_so_far():
    from aisim.search.spica.loop import _Branch, _Search

    bs = [_Branch("agg", None, {}, {}, [], [], None, index=0), _Branch("disagg", None, {}, {}, [], [], None, index=1)]
    order = []
    in_batch: dict[int, int] = {}
    for _ in range(5):
        b = _Search.next_branch(bs, in_batch)
        order.append(b.mode)
        in_batch[b.index] = in_batch.get(b.index, 0) + 1
    assert order == ["agg", "disagg", "agg", "disagg", "agg"]
    bs[0].seen = {"a": {}, "b": {}, "c": {}}  # a resumed search: agg ran ahead when the run was killed
    assert [_Search.next_branch(bs, {}).mode, _Search.next_branch(bs, {1: 2}).mode,
            _Search.next_branch(bs, {1: 3}).mode] == ["disagg", "disagg", "agg"]
    bs[1].exhausted = True
    assert _Search.next_branch(bs, {}).mode == "agg"



def test_keys_added_later_are_stored_only_when_set():
    from aisim.search.spica.config import LATER_KEYS, SearchConfig

    assert ("engine", "nextn_accepted") in LATER_KEYS
    cfg = SearchConfig.from_dict(SEARCH)
    assert "nextn_accepted" not in cfg.dump()["engine"]  # (a study's identity as before the key existed)
    mtp = SearchConfig.from_dict({**SEARCH, "engine": {**SEARCH.get("engine", {}), "nextn_accepted": 0.5,
                                                       "timing": {"type": "default"}},
                                  "search_space": {**SEARCH["search_space"], "aic_nextn": 1}})
    assert mtp.dump()["engine"]["nextn_accepted"] == 0.5 and mtp.fingerprint() != cfg.fingerprint()
