"""Running a capacity search: jobs in parallel, each job's search sequential, every trial a replay.

- Lanes: ``max_parallel`` (default: the CPU count, at most what the jobs can use) lanes, each a
  one-worker ``search.fanout`` Fanout (a local worker process started once, or Ray tasks), so a
  trial never pays a process start-up after its lane's first. The jobs share them: a free lane
  takes the best trial worth starting (``_dispatch``): an adaptive search's trial now (a chain of
  trials that run one after another), then the ones a growing adaptive search needs next if its
  trials pass, then a sweep's trials (independent, they fill what the chains leave), then any trial
  an adaptive search may need next. A trial is recorded (files, cache, progress) only when its
  search uses it, in the search's order (``algorithms``: ``AdaptivePlan``, ``LinearPlan``), so
  the outputs are those of one trial after another; results never depend on the lanes.
- A trial: the job's predict config at the trial's QPS (``config.trial_config``), replayed in the
  worker with per-request records and worker timelines captured; the worker returns the
  prediction and the request and timeline rows as data (``TrialRows``), the SLA is evaluated here
  on those rows (``sla.evaluate_rules``) and the files are written from them, the same text
  ``aisim predict --csv`` writes, by one writer thread in the order the trials are used (off the
  job's path: the search goes on with the verdict; a job waits for its files before its
  summary). ``benchmark_timeout`` bounds each trial (its worker is killed, the trial is
  ``timed_out`` and its job's search stops).
- Cache: a completed trial's rows are stored in a ``search.cache.TrialCache`` under ``cache_dir``,
  keyed by a digest of its resolved predict config and the aisim version (``config_key``); a rerun
  (into any output directory) reuses them and only re-evaluates the SLA (``cached: true``).
- A job that raises is recorded with its error and skipped; the others run.
- Outputs (atomic): ``capacity_search_results.json``, ``capacity_search_results.csv``,
  ``jobs/<name>_<key>/job_summary.json`` and ``jobs/<name>_<key>/runs/<qps>/`` (``config.yaml`` =
  the trial's predict config, ``prediction.json``, ``request_metrics.csv``, ``worker_timeline.csv``,
  ``trial_result.json``).
"""

from __future__ import annotations

import csv
import io
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["CapacityResult", "JobResult", "run_capacity_search", "run_capacity_trial", "default_cache_dir",
           "REPORT_FILE"]

REPORT_FILE = "capacity_report.html"  # report=True / --report



def default_cache_dir() -> Path:
    root = os.environ.get("AISIM_CACHE_DIR")
    return (Path(root) if root else Path.home() / ".cache" / "aisim") / "capacity"


@dataclass
class JobResult:
    job_name: str
    job_key: str
    mode: str
    max_qps_under_sla: float | None
    num_trials: int
    error: str | None
    search_trace: list[dict] = field(default_factory=list)
    stopped: str | None = None

    def to_dict(self) -> dict:
        return {"job_name": self.job_name, "job_key": self.job_key, "mode": self.mode,
                "max_qps_under_sla": self.max_qps_under_sla, "num_trials": self.num_trials, "error": self.error,
                "stopped": self.stopped, "search_trace": self.search_trace}


@dataclass
class CapacityResult:
    jobs: list[JobResult]
    output_dir: Path

    @property
    def failed(self) -> bool:
        return any(j.error for j in self.jobs)

    def to_dict(self) -> dict:
        return {"jobs": [j.to_dict() for j in self.jobs]}


# -- the worker side ------------------------------------------------------------------------------
@dataclass(frozen=True)
class TrialRows:
    """What a capacity trial returns: its prediction and its rows, as data (no file text)."""

    prediction: dict  # prediction.json's document (per_request points at request_metrics.csv)
    request_rows: list  # request_metrics.csv rows (``REQUEST_CSV_COLUMNS`` order)
    timeline_rows: list  # worker_timeline.csv rows (``timeline.CSV_COLUMNS`` order)
    # decided early (``search.capacity.early``): {reason, bound, checkpoint: {at_s, ended_requests}}
    decided: dict | None = None

    def files(self) -> dict[str, str]:
        """The three files as ``aisim predict --csv`` writes them."""
        from aisim.simulator.metrics.csv_out import REQUEST_CSV_COLUMNS
        from aisim.simulator.metrics.output import canonical_json, csv_lines
        from aisim.simulator.metrics.timeline import CSV_COLUMNS

        return {"prediction.json": canonical_json(self.prediction) + "\n",
                "request_metrics.csv": "".join(csv_lines(REQUEST_CSV_COLUMNS, self.request_rows)),
                "worker_timeline.csv": "".join(csv_lines(CSV_COLUMNS, self.timeline_rows))}

    def sla(self, rules) -> tuple[bool, list[dict]]:
        """``sla.evaluate_columns`` on the rows' columns (the verdict of the two CSV files)."""
        from aisim.search.capacity.sla import evaluate_columns
        from aisim.simulator.metrics.csv_out import REQUEST_CSV_COLUMNS
        from aisim.simulator.metrics.timeline import CSV_COLUMNS

        def columns(names, rows) -> dict:
            return dict(zip(names, zip(*rows))) if rows else {}

        return evaluate_columns(rules, columns(REQUEST_CSV_COLUMNS, self.request_rows),
                                columns(CSV_COLUMNS, self.timeline_rows))

    def to_cache(self) -> dict:
        return {"prediction": self.prediction, "request_rows": [list(r) for r in self.request_rows],
                "timeline_rows": [list(r) for r in self.timeline_rows], "decided": self.decided}

    @classmethod
    def from_cache(cls, doc) -> "TrialRows | None":
        try:
            return cls(doc["prediction"], doc["request_rows"], doc["timeline_rows"], doc.get("decided"))
        except (KeyError, TypeError, AttributeError):
            return None

    def still_decides(self, rules) -> bool:
        """A trial decided early answers ``rules`` only if what it proved fails one of them
        (``early.proves``: the rule itself or a stricter one on the same quantile; a rejection: any
        request rule); else it must be replayed in full."""
        if self.decided is None:
            return True
        from aisim.search.capacity.early import proves

        return any(proves(self.decided["bound"], r) for r in rules)


def run_capacity_trial(item: dict) -> TrialRows | dict:
    """Replay one trial (in a fan-out worker): {"config": predict mapping, "config_dir": str | None}
    -> ``TrialRows``, or a failed ``TrialResult`` dict."""
    from aisim.search.trial import TrialResult, plan_with_overrides
    from aisim.simulator.metrics.timeline import timeline_rows
    from aisim.simulator.run import run_plan

    t0 = time.perf_counter()
    try:
        plan = plan_with_overrides(item["config"], {}, item.get("config_dir"), capture_per_request=True,
                                   capture_worker_timeline=True)
        monitor = None
        if item.get("early_rules"):
            from aisim.search.capacity.early import SlaMonitor

            monitor = SlaMonitor(item["early_rules"], plan.traffic.workload.num_requests)
        report = run_plan(plan, monitor=monitor, request_rows=True)  # (records kept as the CSV's rows)
        doc = report.to_dict(with_records=False)
        doc["per_request"] = {"path": "request_metrics.csv", "records": len(report.per_request or [])}
        decided = None
        if monitor is not None and "stopped_early" in doc["summary"]:  # (decided at the very end: a full run)
            decided = {**monitor.decision, "checkpoint": {"at_s": monitor.at_ms / 1000.0,
                                                          "ended_requests": doc["summary"]["completed_requests"]
                                                          + doc["summary"].get("rejected_requests", 0)}}
        return TrialRows(doc, list(report.per_request or []), list(timeline_rows(report.timelines or [])), decided)
    except Exception as exc:  # noqa: BLE001 - a trial classifies every failure
        return TrialResult.from_exception(exc, time.perf_counter() - t0).to_dict()


# -- the parent side --------------------------------------------------------------------------------
def _early_results(rules, decided: dict) -> list[dict]:
    """``sla_results`` of a trial decided early: the rules its bound proves to fail (``early.proves``:
    no full quantile, the bound instead), the others not evaluated (``passed`` None)."""
    from aisim.search.capacity.early import proves

    out = []
    for r in rules:
        proved = proves(decided["bound"], r)
        out.append({"metric": r.metric, "quantile": r.quantile, "op": r.op, "threshold": r.threshold, "value": None,
                    "passed": False if proved else None, **({"decided_early": True} if proved else {})})
    return out


def _qps_dir(qps: float) -> str:
    return f"{qps:.6g}"


class _Lane:
    """One job at a time, its trials one after another, on its own one-worker Fanout."""

    def __init__(self, backend: str, ray_address: str | None) -> None:
        from aisim.search.fanout import fanout

        self.fan = fanout(backend, 1, ray_address)

    def close(self) -> None:
        self.fan.close()


class _Job:
    def __init__(self, search: "_Search", job, index: int) -> None:
        from aisim.search.capacity.config import job_config, job_key, job_qps_list

        self.s = search
        self.job = job
        self.index = index
        self.mapping = job_config(search.cfg, job)
        self.key = job_key(self.mapping)
        self.qps_list = job_qps_list(search.cfg, job)
        self.dir = search.out / "jobs" / f"{job.name}_{self.key}"
        self._trace_rps: float | None | bool = False
        self._writes: list = []  # the futures of its trials' writes (search.writer)

    def trace_rps(self) -> float | None:
        """Requests per second of the job's trace (None for synthetic traffic)."""
        if self._trace_rps is False:
            from aisim.simulator.config import models as m
            from aisim.simulator.config.loading import validate_config
            from aisim.simulator.traffic.build import build_traffic

            cfg = validate_config(self.mapping)
            rps = None
            if isinstance(cfg.traffic.source, m.TraceSource):
                w = build_traffic(cfg.traffic, self.s.config_dir).workload
                span_s = (float(w.timestamp_ms.max()) - float(w.timestamp_ms.min())) / 1000.0
                rps = len(w) / span_s if span_s > 0 else float(len(w))
            self._trace_rps = rps
        return self._trace_rps

    def rules(self) -> list:
        from aisim.search.capacity.sla import SlaRule

        return [SlaRule(r.metric, r.quantile, r.threshold, r.op) for r in self.s.cfg.sla]

    def replay(self, lane: _Lane, qps: float) -> "_Replayed":
        """The trial at ``qps`` from the cache or replayed on ``lane``; nothing written (``record``
        writes it, when the search uses it)."""
        from aisim.search.cache import config_key
        from aisim.search.capacity.config import trial_config

        cfg = self.s.cfg
        mapping = trial_config(self.mapping, qps, self.trace_rps())
        key = config_key(mapping)
        rules = self.rules()
        rows = TrialRows.from_cache(self.s.cache.get(key)) if self.s.cache is not None else None
        if rows is not None and not rows.still_decides(rules):
            rows = None  # decided early on a rule this SLA no longer has: replay it
        out = _Replayed(qps, mapping, key, rows, rows is not None)
        if rows is None:
            item = {"config": mapping, "config_dir": str(self.s.config_dir) if self.s.config_dir else None,
                    "early_rules": rules if cfg.search.early_decisions and rules else None}
            res = lane.fan.map(run_capacity_trial, [item], item_timeout_s=cfg.benchmark_timeout_s)[0]
            if isinstance(res, TrialRows):
                out.rows = res
            else:
                res = res if isinstance(res, dict) else res.to_dict()
                if res.get("status") == "timeout":
                    out.timed_out = True
                else:
                    out.error = res.get("message") or "the trial failed"
        return out

    def record(self, r: "_Replayed"):
        """A trial the search uses: judged against the SLA here (the search needs the verdict
        now); cached and its files written by the search's writer thread, off the job's path
        (``run`` waits for them before the job's summary)."""
        from aisim.search.capacity.algorithms import TrialOutcome

        cfg = self.s.cfg
        qps, rows, cached, timed_out, error = r.qps, r.rows, r.cached, r.timed_out, r.error
        rules = self.rules()
        sla_results: list[dict] = []
        passed = None
        if rows is not None:
            if rows.decided is not None:
                passed, sla_results = False, _early_results(rules, rows.decided)
            elif cfg.sla:
                passed, sla_results = rows.sla(rules)
        elif timed_out:
            passed = False
        trial = {"qps": qps, "passed": passed, "timed_out": timed_out, "cached": cached, "sla_results": sla_results}
        early = {}
        if rows is not None and rows.decided is not None:
            early = {"decided_early": True, "checkpoint": rows.decided["checkpoint"], "bound": rows.decided["bound"],
                     "decided_reason": rows.decided["reason"]}
            trial.update(early)
        if error is not None:
            trial["error"] = error
        self._writes.append(self.s.writer.submit(self._write, r, trial))
        self.s.progress_event(self.job.name, qps, passed, timed_out)
        if error is not None:  # the replay itself failed (not the SLA): the job stops with this error
            raise RuntimeError(f"the trial at {qps:g} QPS failed: {error}")
        return TrialOutcome(passed, timed_out, {"cached": cached, "sla_results": sla_results, **early,
                                                **({"error": error} if error else {})})

    def _write(self, r: "_Replayed", trial: dict) -> None:
        """A used trial's cache entry and files (in the writer thread)."""
        import yaml

        from aisim.simulator.metrics.output import atomic_write_text, canonical_json

        if r.rows is not None and not r.cached and self.s.cache is not None:
            self.s.cache.put(r.key, r.rows.to_cache())
        run_dir = self.dir / "runs" / _qps_dir(r.qps)
        run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(run_dir / "config.yaml", yaml.safe_dump(r.mapping, sort_keys=False))
        if r.rows is not None:
            for name, text in r.rows.files().items():
                atomic_write_text(run_dir / name, text)
        atomic_write_text(run_dir / "trial_result.json", canonical_json(trial) + "\n")

    def plan(self):
        """The job's search as a sequencer: ``AdaptivePlan`` (``start_qps``) or ``LinearPlan``."""
        from aisim.search.capacity.algorithms import LinearPlan, adaptive_plan

        cfg = self.s.cfg
        if self.job.start_qps is None:
            return LinearPlan(self.qps_list)
        return adaptive_plan(self.job.start_qps, max_iterations=cfg.search.max_iterations,
                             min_search_granularity_pct=cfg.search.min_search_granularity_pct,
                             max_qps_cap=cfg.search.max_qps_cap)

    # -- driven by the dispatcher (``_dispatch``), in its thread --------------------------------
    def begin(self) -> None:
        self.sequencer = self.plan()
        self.ready: dict[float, _Replayed] = {}  # replayed, not used yet
        self.running: set[float] = set()
        self.result: JobResult | None = None

    def candidates(self, lanes: int) -> list[tuple[tuple, float]]:
        """``(priority, qps)`` of the trials worth starting now (not replayed or running), lower
        priorities first (``_dispatch`` has the order and why)."""
        plan = self.sequencer
        if self.result is not None or plan.done:
            return []
        want = lanes + len(self.running) + len(self.ready) + 1
        sweep = self.job.start_qps is None
        likely = [] if sweep else plan.likely_path(want)
        points = _ahead(plan, want)
        points += [q for q in likely if q not in points]
        out = []
        for k, q in enumerate(points):
            if q in self.ready or q in self.running:
                continue
            tier = 2 if sweep else 0 if k == 0 else 1 if q in likely else 3
            out.append(((tier, self.index, likely.index(q) if tier == 1 else k), q))
        return out

    def advance(self) -> None:
        """Use the replayed trials the search needs, in its order; finish once it is done."""
        plan = self.sequencer
        try:
            while self.result is None and not plan.done and plan.next_qps() in self.ready:
                q = plan.next_qps()
                plan.tell(q, self.record(self.ready.pop(q)))
            if self.result is None and plan.done:
                self.finish(plan.outcome(), None)
        except Exception as exc:  # noqa: BLE001 - a job that raises is recorded and skipped
            self.finish(None, exc)

    def finish(self, out, exc: BaseException | None) -> None:
        """The job's result and ``job_summary.json`` (after its trials' files)."""
        from aisim.search.trial import one_line
        from aisim.simulator.metrics.output import atomic_write_text, canonical_json

        job = self.job
        try:
            for f in self._writes:  # its trials' files, before its summary (a write error: the job's)
                f.result()
        except Exception as write_exc:  # noqa: BLE001
            exc = exc or write_exc
        if exc is None:
            best = out.max_qps_under_sla if self.s.cfg.sla else None
            self.result = JobResult(job.name, self.key, job.mode, best, len(out.trace), None, out.trace, out.stopped)
        else:
            self.result = JobResult(job.name, self.key, job.mode, None, 0, one_line(exc))
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.dir / "job_summary.json", canonical_json(self.result.to_dict()) + "\n")


def _ahead(plan, want: int) -> list[float]:
    """At least ``want`` of the QPS ``plan`` may need next (fewer when it has fewer), the first
    the one it needs now: ``plan.speculative`` at the smallest depth that gives them."""
    depth = 1
    points = plan.speculative(depth)
    while len(points) < want and depth < want:
        depth += 1
        more = plan.speculative(depth)
        if len(more) == len(points):
            break
        points = more
    return points


@dataclass
class _Replayed:
    """A trial's replay (or cache hit) before the search uses it."""

    qps: float
    mapping: dict
    key: str
    rows: TrialRows | None
    cached: bool
    timed_out: bool = False
    error: str | None = None


class _Search:
    def __init__(self, cfg, config_dir: Path | None, out: Path, cache_dir: Path | None,
                 progress: Callable[[dict], None] | None) -> None:
        self.cfg = cfg
        self.config_dir = config_dir
        self.out = out
        from aisim.search.cache import TrialCache

        self.cache = TrialCache(cache_dir) if cache_dir is not None else None
        self.progress = progress
        self._lock = threading.Lock()
        self.num_trials = 0
        # the used trials' cache entries and files, written in order off the jobs' paths
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="aisim-capacity-writer")

    def progress_event(self, job: str, qps: float, passed, timed_out: bool) -> None:
        with self._lock:
            self.num_trials += 1
            n = self.num_trials
        if self.progress is not None:
            self.progress({"trials": n, "job": job, "qps": qps, "passed": passed, "timed_out": timed_out})


def run_capacity_search(config, output_dir: Path | str, *, backend: str = "local", ray_address: str | None = None,
                        max_parallel: int | None = None, cache_dir: Path | str | None = None, use_cache: bool = True,
                        search_overrides: dict | None = None, overrides: list[str] | None = None,
                        progress: Callable[[dict], None] | None = None, report: bool = False) -> CapacityResult:
    """Run every job of a capacity config (a path to its YAML, or a mapping) and write the outputs
    into ``output_dir``. ``search_overrides``: max_iterations, min_search_granularity_pct,
    max_qps_cap (the CLI flags); ``overrides``: ``--set PATH=YAML`` over the config, applied first;
    ``report``: also write ``capacity_report.html`` (needs matplotlib)."""
    from aisim.search.capacity.config import load_capacity_config
    from aisim.simulator.metrics.output import lock_output_dir

    if isinstance(config, dict):
        cfg, config_dir = load_capacity_config(data=config, overrides=search_overrides, sets=overrides)
    else:
        cfg, config_dir = load_capacity_config(Path(config), overrides=search_overrides, sets=overrides)
    if report:
        from aisim.simulator.metrics.report_html import require_matplotlib

        require_matplotlib("--report")
    out = Path(output_dir)
    lock = lock_output_dir(out)  # one search writes a directory at a time (as predict)
    try:
        return _run_jobs(cfg, config_dir, out, backend, ray_address, max_parallel, cache_dir, use_cache, progress,
                         report)
    finally:
        lock.release()


def _dispatch(jobs: list[_Job], lanes_n: int, backend: str, ray_address: str | None) -> None:
    """Run the jobs' searches on ``lanes_n`` lanes. Whenever a lane is free it takes the best
    trial worth starting, in this order: an adaptive search's trial now (it heads a chain of
    trials that can only run one after another), the trials a growing adaptive search needs
    next if its trials pass, nearest first (growing searches mostly pass), a sweep's trials in list order
    (they depend on nothing, so they fill the lanes the chains leave), then the trials an
    adaptive search may need next for either verdict; ties by job order. A trial is used
    (recorded) only when its search needs it, in the search's order (``_Job.advance``), so the
    outputs are those of the trials run one after another; a trial started ahead that the search
    never needs is discarded when it ends, and one still running once every search is done is
    stopped (``Fanout.abort``: local workers are killed; Ray tasks finish)."""
    for j in jobs:
        j.begin()
    free: list[_Lane | None] = [None] * lanes_n  # (a lane starts on its first trial, in its thread)
    lanes: list[_Lane] = []
    ended: queue.Queue = queue.Queue()
    threads: list[threading.Thread] = []

    def run(job: _Job, lane: _Lane | None, qps: float) -> None:
        result = error = None
        try:
            if lane is None:
                try:
                    lane = _Lane(backend, ray_address)
                except BaseException as exc:  # noqa: BLE001 - no worker: the search cannot run
                    ended.put(exc)
                    return
                lanes.append(lane)
            result = job.replay(lane, qps)
        except BaseException as exc:  # noqa: BLE001 - the job's, if it needs this trial
            error = exc
        ended.put((job, qps, result, error, lane))

    try:
        while True:
            for j in jobs:
                j.advance()
            if all(j.result is not None for j in jobs):
                break
            while free:
                best = min((c + (j,) for j in jobs for c in j.candidates(len(free))),
                           key=lambda c: c[0], default=None)
                if best is None:
                    break
                _, q, j = best
                j.running.add(q)
                t = threading.Thread(target=run, args=(j, free.pop(), q), daemon=True)
                threads.append(t)
                t.start()
            if len(free) == lanes_n:  # (nothing runs and nothing can start: a job is stuck)
                raise AssertionError("capacity search: no trial to run")  # pragma: no cover
            while True:  # (a timeout, so an interrupt reaches this thread)
                try:
                    item = ended.get(timeout=0.2)
                    break
                except queue.Empty:
                    continue
            while item is not None:
                if isinstance(item, BaseException):
                    raise item
                job, q, result, error, lane = item
                free.append(lane)
                job.running.discard(q)
                if error is None:
                    job.ready[q] = result
                elif job.result is None and job.sequencer.next_qps() == q:  # (a trial ahead: replayed if needed)
                    job.finish(None, error)
                try:
                    item = ended.get_nowait()
                except queue.Empty:
                    item = None
        for lane in lanes:  # (trials ahead that no search needed: stopped, not waited for)
            if lane not in free:
                lane.fan.abort()
        for t in threads:
            t.join()
    finally:
        for lane in lanes:
            lane.close()


def _run_jobs(cfg, config_dir, out: Path, backend, ray_address, max_parallel, cache_dir, use_cache,
              progress, report: bool) -> CapacityResult:
    from aisim.simulator.metrics.output import atomic_write_text, canonical_json

    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if use_cache else None
    search = _Search(cfg, config_dir, out, cache, progress)
    jobs = [_Job(search, job, i) for i, job in enumerate(cfg.jobs)]
    # (more lanes than trials worth running at once would idle: a sweep's list, an adaptive
    # search's trial now and both next ones)
    useful = sum(len(j.qps_list) if j.job.start_qps is None else 3 for j in jobs)
    lanes_n = max(1, min(useful, max_parallel or os.cpu_count() or 1))
    try:
        _dispatch(jobs, lanes_n, backend, ray_address)
    finally:
        search.writer.shutdown(wait=True)  # (each job waited for its own writes; after an interrupt, the rest)
    results = {j.index: j.result for j in jobs}
    result = CapacityResult([results[i] for i in range(len(jobs))], out)
    atomic_write_text(out / "capacity_search_results.json", canonical_json(result.to_dict()) + "\n")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["job_name", "job_key", "max_qps_under_sla", "num_trials", "error"])
    for j in result.jobs:
        w.writerow([j.job_name, j.job_key, "" if j.max_qps_under_sla is None else repr(j.max_qps_under_sla),
                    j.num_trials, j.error or ""])
    atomic_write_text(out / "capacity_search_results.csv", buf.getvalue())
    if report:
        from aisim.search.capacity.report import render_capacity_html

        atomic_write_text(out / REPORT_FILE, render_capacity_html(result.to_dict()))
    return result

