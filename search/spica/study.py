"""A Spica search's study storage: where it lives, whether the search already exists there, the
config stored with it, and the claim that keeps one live run per search (docs/spica-studies.md).

A search named ``N`` is one Optuna study per deployment mode, ``N-<mode>``, in one storage: the
journal file ``DIR/study.journal`` by default, a journal file path, or any Optuna storage URL
(``sqlite:///x.db``, ``postgresql://...``). Every branch study carries the user attribute
``aisim_search``: the search's name, its mode, the validated config (so the search can be resumed
from the storage and the name alone), the config's directory, the output directory and the
*identity* digest (the config less the knobs that may change between a run and its resume:
``optimizer.max_trials``, ``optimizer.parallelism``, ``optimizer.candidate_timeout_seconds``,
``execution``, ``study.storage``, ``dgd``).

The claim: one live run per search. Where the storage is a file (a journal, SQLite) the run holds an
exclusive ``flock`` beside it (``.<file>.<name>.aisim-claim``), which the kernel releases when the
process ends in any way, so a dead run's claim is taken over at once. Every storage also carries
the claim in the branch studies' system attribute ``aisim_claim`` (host, pid, the pid's start time,
a heartbeat), so a run on another storage kind is refused while a live process holds it: on this
host a claim whose process is gone (or whose pid now belongs to another process) is stale; a claim
from another host is stale once its heartbeat is older than twice the candidate timeout plus a
minute. A run checks before every tell that the claim is still its own (renewing the heartbeat at
most once a minute).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aisim.simulator.errors import InputError

__all__ = ["STUDY_FILE", "SEARCH_ATTR", "CLAIM_ATTR", "Location", "locate", "identity", "identity_view", "differing_keys", "SearchStudies",
           "find_search", "Claim"]

STUDY_FILE = "study.journal"
SEARCH_ATTR = "aisim_search"
CLAIM_ATTR = "aisim_claim"
MODES = ("agg", "disagg")
HEARTBEAT_S = 60.0  # the claim's heartbeat is written at most this often
# the config knobs a resume may change (everything else must match the stored search)
_RESUMABLE = {"optimizer": ("max_trials", "parallelism", "candidate_timeout_seconds"), "study": ("storage",),
              "execution": None, "dgd": None}


@dataclass(frozen=True)
class Location:
    """Where a search's studies live: ``url`` for Optuna (None: a journal file), ``file`` the file
    that holds them when there is one, ``label`` what a person is told."""

    url: str | None
    file: Path | None
    label: str
    default: bool  # the journal in the output directory

    def open(self):
        import optuna

        if self.url is None:
            from optuna.storages.journal import JournalFileBackend

            return optuna.storages.JournalStorage(JournalFileBackend(str(self.file)))
        try:
            return optuna.storages.get_storage(self.url)
        except Exception as exc:  # a bad URL, a missing driver, an unreachable server
            raise InputError("--storage", f"cannot open Optuna storage {self.url!r}: {type(exc).__name__}: {exc}; "
                                          "give sqlite:///PATH.db, a journal file path (*.journal) or a reachable "
                                          "database URL") from None


def locate(storage: str | None, output_dir: Path) -> Location:
    """The location ``storage`` names (None: ``output_dir/study.journal``): a URL with a scheme
    (``sqlite:///x.db``, ``postgresql://...``) or a journal file path ending in ``.journal``."""
    if storage is None:
        path = Path(output_dir) / STUDY_FILE
        return Location(None, path, str(path), True)
    if not isinstance(storage, str) or not storage.strip():
        raise InputError("--storage", "must be an Optuna storage URL (sqlite:///x.db) or a journal file path "
                                      "(*.journal)")
    if "://" in storage:
        file = None
        if storage.startswith("sqlite:///"):
            rest = storage[len("sqlite:///"):].split("?", 1)[0]
            if rest and rest != ":memory:":
                file = Path(rest if rest.startswith("/") else rest)
        return Location(storage, file, storage, False)
    if not storage.endswith(".journal"):
        raise InputError("--storage", f"{storage!r} is neither a storage URL (sqlite:///x.db, postgresql://...) "
                                      "nor a journal file (*.journal): give one of those")
    return Location(None, Path(storage), storage, False)


def identity_view(config_json: dict) -> dict:
    """The search config less the knobs a resume may change (``_RESUMABLE``)."""
    data = json.loads(json.dumps(config_json))
    for section, keys in _RESUMABLE.items():
        if keys is None:
            data.pop(section, None)
        elif isinstance(data.get(section), dict):
            for k in keys:
                data[section].pop(k, None)
    return data


def identity(config_json: dict) -> str:
    """sha256 of ``identity_view(config_json)``'s canonical JSON."""
    text = json.dumps(identity_view(config_json), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def differing_keys(a: dict, b: dict) -> list[str]:
    """The dotted keys whose values differ between two config dumps (sorted). A key one dump lacks
    and the other holds as null is no difference: a study stored before an optional key existed
    resumes under a version that writes it out with its null default."""
    fa, fb = _flat(a), _flat(b)
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k))


@dataclass
class SearchStudies:
    """The branch studies of one search found in a storage."""

    name: str
    studies: list  # optuna FrozenStudy, one per branch found
    attrs: dict | None  # the first branch's ``aisim_search`` attribute (None: a study written before it existed)
    trials: int = 0  # trials in all of them

    @property
    def study_names(self) -> list[str]:
        return [s.study_name for s in self.studies]


def find_search(storage, name: str) -> SearchStudies | None:
    """The studies of search ``name`` in ``storage`` (an opened Optuna storage), or None."""
    found, attrs = [], None
    for s in storage.get_all_studies():
        mine = s.user_attrs.get(SEARCH_ATTR)
        if isinstance(mine, dict) and mine.get("search") == name:
            found.append(s)
            attrs = attrs or mine
        elif mine is None and any(s.study_name == f"{name}-{m}" for m in MODES):
            found.append(s)
    if not found:
        return None
    return SearchStudies(name, found, attrs, sum(storage.get_n_trials(s._study_id) for s in found))


def _start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None if unknown."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()[19]


def _alive(pid: int, start: str | None) -> bool:
    from aisim.simulator.metrics.output import pid_alive

    if not pid_alive(pid):
        return False
    return start is None or _start_time(pid) in (None, start)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)[:100]


@dataclass
class Claim:
    """One live run of search ``name`` in ``location`` (see the module docstring)."""

    location: Location
    name: str
    stale_after_s: float
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    _lock: Any = None
    _studies: list = field(default_factory=list)  # (storage, study_id) carrying the claim
    _beat: float = 0.0

    def _busy(self, who: str) -> InputError:
        return InputError("study", f"search {self.name!r} in {self.location.label} is being run by another aisim "
                                   f"process ({who}); wait for it to finish (one live run per study), or give "
                                   "study.name another name")

    def lock(self) -> None:
        """The file lock, where the storage is a file: before the storage is opened or changed."""
        file = self.location.file
        if file is None:
            return
        from aisim.simulator.metrics.output import ProcessLock

        parent = file.parent if str(file.parent) else Path(".")
        if not parent.is_dir():
            raise InputError("--storage", f"the directory of {file} does not exist: create it or give another path")
        lock = ProcessLock(parent / f".{file.name}.{_safe(self.name)}.aisim-claim")
        try:
            owner = lock.acquire()
        except OSError as exc:
            raise InputError("--storage", f"cannot lock {file}: {exc.strerror}") from None
        if owner is not None:
            raise self._busy(f"pid {owner}" if owner else "pid unknown")
        self._lock = lock

    def check(self, storage, studies: list) -> None:
        """Refuse when a live process other than this one holds a claim on one of ``studies``
        (optuna FrozenStudy); a stale claim is taken over."""
        for s in studies:
            claim = storage.get_study_system_attrs(s._study_id).get(CLAIM_ATTR)
            if not claim or claim.get("token") == self.token:
                continue
            host, pid = claim.get("host"), int(claim.get("pid") or 0)
            if host == socket.gethostname():
                live = pid != os.getpid() and _alive(pid, claim.get("start"))
            else:
                live = time.time() - float(claim.get("heartbeat") or 0) < self.stale_after_s
            if live:
                raise self._busy(f"pid {pid} on {host}")

    def take(self, storage, study_ids: list[int]) -> None:
        """Write this run's claim on the branch studies."""
        self._studies = [(storage, sid) for sid in study_ids]
        self._write(self._record())

    def _record(self) -> dict:
        self._beat = time.time()
        return {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_time(os.getpid()),
                "token": self.token, "heartbeat": self._beat}

    def _write(self, value) -> None:
        for storage, sid in self._studies:
            storage.set_study_system_attr(sid, CLAIM_ATTR, value)

    def refresh(self) -> None:
        """Before a tell: the claim is still this run's (else InputError: another run took it
        over), and its heartbeat is renewed every ``HEARTBEAT_S``."""
        for storage, sid in self._studies:
            claim = storage.get_study_system_attrs(sid).get(CLAIM_ATTR)
            if claim and claim.get("token") != self.token:
                raise InputError("study", f"search {self.name!r} in {self.location.label} was taken over by pid "
                                          f"{claim.get('pid')} on {claim.get('host')}; this run stops (resume it "
                                          "later with --resume)")
        if time.time() - self._beat >= HEARTBEAT_S:
            self._write(self._record())

    def release(self) -> None:
        try:
            if self._studies:
                self._write(None)
        finally:
            self._studies = []
            if self._lock is not None:
                self._lock.release()
                self._lock = None
