"""``aisim`` command line: the composition root (the one module that reaches every layer).

    aisim predict                                   # the bundled quickstart, table on stdout
    aisim predict -c my.yaml --set router.policy=round_robin --output-dir out/
    aisim trace convert --from mooncake --to dynamo in.jsonl out.jsonl [--split-at-seconds S --history-out H]

Exit codes: 0 success, 1 execution failure (also: no request completed; the outputs are still
written), 2 bad input (config, trace, override, flag, output directory), 3 resource limit,
124 initialisation timeout, 130 interrupted (SIGINT), 143 terminated (SIGTERM).

--output-dir is written as one transaction (simulator.metrics.output.OutputTransaction): the run
writes into a staging directory next to it and swaps it into place only when complete, so an
interrupted or failed run (any signal, even SIGKILL) leaves the previous outputs exactly as they
were; the directory is locked while a run writes it.
"""

from __future__ import annotations

import argparse
import gc
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from aisim import configs as _bundled

REPO_CONFIGS = Path(_bundled.__file__).resolve().parent  # the bundled configs (configs/ in the repository)
QUICKSTART = REPO_CONFIGS / "quickstart.yaml"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2, no usage dump)."""

    def error(self, message: str):  # noqa: D102
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _add_set(parser, help: str) -> None:
    """The ``--set PATH=YAML`` option every config-reading command takes (repeatable)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=YAML", help=help)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="aisim", description="Predict how an LLM inference deployment behaves, before renting the GPUs.")
    from aisim import __version__

    p.add_argument("--version", action="version", version=f"aisim {__version__}")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    pr = sub.add_parser("predict", help="replay traffic through simulated workers and report latency/throughput")
    pr.add_argument("-c", "--config", type=Path, default=None, help=f"predict YAML (default: the bundled {QUICKSTART.name})")
    _add_set(pr, "override a config key before validation, e.g. --set 'planner={policy: disabled}' (repeatable)")
    pr.add_argument("--output-dir", type=Path, default=None,
                    help="write prediction.json (and requests.jsonl) here, all at once when the run completes; "
                         "without it nothing is written")
    pr.add_argument("--overwrite", action="store_true",
                    help="replace known aisim outputs in a non-empty --output-dir (other files stay)")
    pr.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    pr.add_argument("--capture-per-request", action="store_true",
                    help="write every request's record to requests.jsonl; prediction.json's per_request points "
                         "to it (needs --output-dir)")
    pr.add_argument("--per-request-in-prediction", action="store_true",
                    help="with --capture-per-request: also keep the records in prediction.json's per_request")
    pr.add_argument("--capture-worker-timeline", action="store_true",
                    help="write worker_timeline.csv: each worker's waiting/running requests and KV usage over "
                         "time (needs --output-dir)")
    pr.add_argument("--csv", action="store_true",
                    help="also write request_metrics.csv (one row per request: times, lengths, worker, status, "
                         "latencies) and worker_timeline.csv (needs --output-dir; prediction.json is unchanged)")
    pr.add_argument("--report", action="store_true",
                    help="also write report.html: latency distributions, throughput, per-worker queues and KV "
                         "usage, replicas and Planner diagnostics, the resolved config; opens offline (needs "
                         "--output-dir and the report extra: pip install 'aisim[report]')")
    pr.add_argument("--backend", choices=("local", "ray"), default=None,
                    help="where the simulated workers, router and Planner live (overrides execution.backend)")
    pr.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                    help="join a running Ray cluster instead of starting a local one (implies --backend ray)")
    _add_trace_parser(sub)
    _add_recommend_parser(sub)
    _add_capacity_parser(sub)
    cm = sub.add_parser("compare", help="compare aisim predict output directories side by side",
                        description="A side-by-side table of runs (GPU hours, goodput, TTFT/ITL/E2E mean, p90, p99, "
                                    "completed and rejected requests, scaling events, retune decisions) with deltas "
                                    "against the first run.")
    cm.add_argument("dirs", nargs="+", metavar="DIR", help="aisim predict --output-dir directories (or prediction.json)")
    cm.add_argument("--format", choices=("table", "json", "csv"), default="table", help="stdout format (default: table)")
    cm.add_argument("--report", type=Path, metavar="FILE",
                    help="also write an HTML page overlaying the runs' TTFT/ITL/E2E distributions and replica "
                         "curves (per-request data where a run kept it: --capture-per-request or --report)")
    va = sub.add_parser("validate", help="validate a predict, recommend or capacity config and show what it resolves to",
                        description="Validate a config without replaying: the effective deployment (GPUs, KV blocks "
                                    "per rank, context length, timing and model sources) and the traffic's statistics "
                                    "(rows, tokens, rows the context limit will reject); search configs show their "
                                    "branches and grids, capacity configs their jobs.")
    va.add_argument("-c", "--config", type=Path, required=True, help="a predict, search or capacity YAML")
    _add_set(va, "override a key before validation (repeatable)")
    va.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    return p


def _add_capacity_parser(sub) -> None:
    cp = sub.add_parser("capacity", help="find the highest QPS a deployment sustains under an SLA (capacity search)",
                        description="Run the jobs of a capacity-search YAML (benchmark_base, jobs, sla, search): "
                                    "adaptive jobs double the QPS until a trial fails, then bisect; linear jobs run a "
                                    "QPS list. Every trial is a replay. Writes capacity_search_results.json/.csv "
                                    "and jobs/<name>_<key>/ under --output-dir.")
    src = cp.add_mutually_exclusive_group(required=True)
    src.add_argument("-c", "--config", type=Path, help="capacity-search YAML")
    src.add_argument("--config-path", dest="config", type=Path, help="the same (the seed's spelling)")
    _add_set(cp, "override a key of the capacity config before validation, e.g. "
                         "--set 'sla=[{metric: ttft_ms, quantile: 0.9, threshold: 500}]' (repeatable; cached trials "
                         "are reused, so changing only the SLA re-decides without replaying)")
    cp.add_argument("--output-dir", type=Path, required=True, help="where the results go")
    cp.add_argument("--max-iterations", type=int, default=None, help="trials per job (overrides search.max_iterations)")
    cp.add_argument("--min-search-granularity-pct", type=float, default=None,
                    help="stop bisecting at this gap (overrides search.min_search_granularity_pct)")
    cp.add_argument("--max-qps-cap", type=float, default=None, help="the highest QPS tried (overrides search.max_qps_cap)")
    cp.add_argument("--overwrite", action="store_true", help="write into an --output-dir that holds earlier results")
    cp.add_argument("--backend", choices=("local", "ray"), default="local", help="where trials run (default: local)")
    cp.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT", help="run trials on a Ray cluster")
    cp.add_argument("--max-parallel", type=int, default=None, help="jobs run at once (default: the CPU count)")
    cp.add_argument("--cache-dir", type=Path, default=None,
                    help="completed trials are cached here (default: $AISIM_CACHE_DIR/capacity or ~/.cache/aisim/capacity)")
    cp.add_argument("--no-cache", action="store_true", help="neither read nor write the trial cache")
    cp.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    cp.add_argument("--report", action="store_true",
                    help="also write capacity_report.html: per job each SLA rule's metric against QPS with the "
                         "threshold and the search trace in order; opens offline (pip install 'aisim[report]')")


def _add_recommend_parser(sub) -> None:
    rc = sub.add_parser("recommend", help="search deployment configurations (Spica): Optuna-driven trials, each a replay",
                        description="Search the deployment configurations of a search YAML (search_space, workload, "
                                    "optimization, optimizer, study); every candidate is a replay. Writes "
                                    "recommendation.json, recommendation.csv and recommendations/NNNN.yaml, and keeps "
                                    "the study in DIR/study.journal (optuna-dashboard DIR/study.journal shows it).")
    rc.add_argument("-c", "--config", type=Path, required=True, help="search YAML")
    _add_set(rc, "override a search config key before validation (repeatable)")
    rc.add_argument("--output-dir", type=Path, default=None,
                    help="where the study and the recommendation go (required unless --print-search-space)")
    rc.add_argument("--print-search-space", action="store_true",
                    help="print the search this config becomes in the search_space form (a reference-form config "
                         "lowered; docs/recommend-forms.md) and exit without running it")
    rc.add_argument("--resume", action="store_true",
                    help="continue the study in --output-dir (finished trials are not re-run); without an earlier "
                         "study a new one starts")
    rc.add_argument("--overwrite", action="store_true", help="start over in a --output-dir that holds a study")
    rc.add_argument("--backend", choices=("local", "ray"), default="local",
                    help="where trials run: local worker processes (default) or Ray tasks")
    rc.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT", help="run trials on a Ray cluster")
    rc.add_argument("--parallelism", type=int, default=None, help="trials in flight (overrides optimizer.parallelism)")
    rc.add_argument("--storage", default=None, metavar="URL", help="Optuna storage URL (default: DIR/study.journal)")
    rc.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    rc.add_argument("--report", action="store_true",
                    help="also write recommendation.html: score against GPUs with the winner or the Pareto front, "
                         "the top candidates, why the others failed; opens offline (pip install 'aisim[report]')")
    rc.add_argument("--output", choices=("dgd",), default=None,
                    help="also write the winner's DynamoGraphDeployment (pareto: every front member's), as the "
                         "config's dgd section says (default name: spica)")


#: ``aisim trace convert`` conversions: (--from, --to) -> the converter's name in simulator.traffic.convert
TRACE_CONVERSIONS = {("mooncake", "dynamo"): "mooncake_to_dynamo"}
#: the converter's argument names -> the command line's
_CONVERT_ARGS = {"in_path": "IN", "out_path": "OUT", "block_size": "--block-size",
                 "split_at_seconds": "--split-at-seconds", "history_out": "--history-out"}


def _block_size_arg(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (tokens per trace hash id), got {text!r}")
    return value


def _seconds_arg(text: str) -> float:
    import math

    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _add_trace_parser(sub) -> None:
    tr = sub.add_parser("trace", help="convert request traces between formats")
    tr.set_defaults(trace_help=tr.print_help)
    actions = tr.add_subparsers(dest="action", metavar="ACTION", parser_class=_Parser)
    cv = actions.add_parser(
        "convert", help="convert a mooncake trace to dynamo.request.trace.v1, optionally split into history and replay",
        description="Convert a mooncake JSONL trace to dynamo.request.trace.v1. Every request keeps its "
                    "timestamp; a converted row has no total_time_ms (a mooncake row records no latency). "
                    "With --split-at-seconds S the requests in [0, S) seconds after the first request go to "
                    "--history-out and the rest to OUT. Existing files are replaced atomically.")
    cv.add_argument("--from", dest="from_format", required=True, choices=sorted({f for f, _ in TRACE_CONVERSIONS}),
                    help="input format")
    cv.add_argument("--to", dest="to_format", required=True, choices=sorted({t for _, t in TRACE_CONVERSIONS}),
                    help="output format")
    cv.add_argument("input", metavar="IN", help="input trace: a file, a directory of .jsonl/.jsonl.gz shards or a glob")
    cv.add_argument("output", metavar="OUT", type=Path, help="output trace (.jsonl); the replay part with a split")
    cv.add_argument("--block-size", type=_block_size_arg, default=512,
                    help="tokens per trace hash id, embedded in every record (default: 512)")
    cv.add_argument("--split-at-seconds", type=_seconds_arg, default=None, metavar="S",
                    help="split at S seconds after the first request (needs --history-out)")
    cv.add_argument("--history-out", type=Path, default=None, metavar="H",
                    help="with --split-at-seconds: write the requests before S here (the predictor history)")


def _execution_overrides(args) -> list[str]:
    """--backend and --ray-address as config overrides (validated with the config)."""
    import json

    out = []
    backend = args.backend or ("ray" if args.ray_address is not None else None)
    if backend is not None:
        out.append(f"execution.backend={backend}")
    if args.ray_address is not None:
        out.append(f"execution.ray_address={json.dumps(args.ray_address)}")
    return out


class _Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread (``signum`` says which)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """SIGINT and SIGTERM both interrupt the run (``_Interrupted``), so every ``finally`` runs and the
    output transaction is rolled back. Inside ``deferred()`` a signal waits for the block to end (the
    output directory is never left half-changed); after ``finish()`` (the outputs are being put in
    place) a signal no longer changes the outcome. Installed only in the main thread."""

    HANDLED = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._previous: dict = {}
        self._depth = 0
        self._pending: int | None = None
        self._finished = False
        self._replaced: set = set()

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for s in self.HANDLED:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def _reinstall(self) -> None:
        """Take the signals back from whoever replaced our handlers (``ray.init`` installs a SIGTERM
        handler that calls ``sys.exit``)."""
        for s in self._previous:
            if signal.getsignal(s) != self._handle:
                self._replaced.add(s)
                signal.signal(s, self._handle)

    def replaced_sigterm(self) -> bool:
        """Whether a library's SIGTERM handler (not ours) was in place: its ``sys.exit(15)`` means SIGTERM."""
        self._reinstall()
        return signal.SIGTERM in self._replaced

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self._finished:
            return
        if self._depth:
            if self._pending is None:
                self._pending = signum
            return
        raise _Interrupted(signum)

    @contextmanager
    def deferred(self):
        self._reinstall()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if not self._depth and self._pending is not None and not self._finished:
            signum, self._pending = self._pending, None
            raise _Interrupted(signum)

    def finish(self) -> None:
        self._reinstall()
        self._finished = True


_INTERRUPT_EXIT = {signal.SIGINT: (130, "interrupted"), signal.SIGTERM: (143, "terminated")}

#: the table's box-drawing characters, for a stdout that cannot encode them (PYTHONIOENCODING=ascii)
_ASCII_BOX = str.maketrans({**{c: "+" for c in "┏┳┓┡╇┩└┴┘┌┬┐├┼┤╞╪╡"},
                            "━": "=", "─": "-", "┃": "|", "│": "|"})


def _encodable(text: str, stream) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "utf-8")
    except (UnicodeError, LookupError):
        return False
    return True


def _for_stream(text: str, stream) -> str:
    """``text`` as ``stream`` can encode it: box-drawing characters become + - = |, anything else
    unencodable becomes ``?``."""
    if _encodable(text, stream):
        return text
    text = text.translate(_ASCII_BOX)
    enc = getattr(stream, "encoding", None) or "utf-8"
    try:
        return text.encode(enc, errors="replace").decode(enc)
    except LookupError:
        return text.encode("ascii", errors="replace").decode("ascii")


def _terminal_width(stream) -> int | None:
    """The columns of the terminal ``stream`` writes to; off a terminal ``COLUMNS`` when it is set (a
    positive number), else None (the full table)."""
    try:
        if not stream.isatty():
            cols = os.environ.get("COLUMNS", "").strip()
            return int(cols) if cols.isdigit() and int(cols) > 0 else None
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return None


def _silence_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the interpreter's final flush stays quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _counts(reasons: dict) -> str:
    return ", ".join(f"{code} {n:,}" for code, n in sorted(reasons.items(), key=lambda kv: (-kv[1], str(kv[0]))))


def _outcome(summary: dict) -> tuple[str | None, str | None]:
    """(failure, warning): failure when no request completed, a warning when some were rejected.
    ``rejection_reasons`` ({reason: count}) is read defensively (older summaries lack it)."""
    def count(key: str) -> int:
        v = summary.get(key)
        return v if isinstance(v, int) else 0

    offered, completed, rejected, incomplete = (count(k) for k in ("num_requests", "completed_requests",
                                                                   "rejected_requests", "incomplete_requests"))
    reasons = summary.get("rejection_reasons")
    reasons = {k: v for k, v in reasons.items() if isinstance(v, int) and v > 0} if isinstance(reasons, dict) else {}
    if completed == 0:
        parts = []
        if rejected:
            parts.append(f"{rejected:,} rejected" + (f": {_counts(reasons)}" if reasons else ""))
        if incomplete:
            parts.append(f"{incomplete:,} incomplete when the replay stopped")
        detail = "; ".join(parts) if parts else f"{offered:,} offered"
        return f"no request completed ({detail})", None
    if rejected:
        text = f"{rejected:,} of {offered:,} requests rejected"
        text += f" ({_counts(reasons)}); see rejection_reasons" if reasons else "; see rejected_requests"
        return None, text
    return None, None


def _check_kind(args, command: str) -> None:
    """A config of another command's kind is refused naming the command that runs it."""
    if args.config is None:
        return
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping
    from aisim.simulator.errors import InputError
    from aisim.validate import detect_kind

    data = apply_overrides(read_yaml_mapping(args.config, "config"), list(getattr(args, "overrides", []) or []))
    kind = detect_kind(data)
    want = command
    if kind != want:
        section = next((k for k in ("optimization", "optimizer") if k in data and "search_space" not in data), None)
        if section is not None:  # a predict config carrying a search's section (the reference's rule)
            raise InputError(section, f"is a recommend section, so {args.config} is a search: run `aisim recommend -c "
                                      f"{args.config} --output-dir DIR`, or remove {section} to {want} one config")
        extra = " --output-dir DIR" if kind != "predict" else ""
        raise InputError("--config", f"{args.config} is a {kind} config, not a {want} one: run "
                                     f"`aisim {kind} -c {args.config}{extra}`")


def _predict(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim predict``; ``t0`` is the ``time.perf_counter()`` at which the command started (the
    initialisation timeout and the recorded runtime count from it, not from when this module was imported)."""
    from aisim.simulator.errors import InputError

    _check_kind(args, "predict")
    if args.capture_per_request and args.output_dir is None:
        raise InputError("--capture-per-request", "needs --output-dir to write requests.jsonl")
    if args.capture_worker_timeline and args.output_dir is None:
        raise InputError("--capture-worker-timeline", "needs --output-dir to write worker_timeline.csv")
    if args.csv and args.output_dir is None:
        raise InputError("--csv", "needs --output-dir to write request_metrics.csv and worker_timeline.csv")
    if args.report:
        if args.output_dir is None:
            raise InputError("--report", "needs --output-dir to write report.html")
        from aisim.simulator.metrics.report_html import require_matplotlib

        require_matplotlib("--report")
    if args.per_request_in_prediction and not args.capture_per_request:
        raise InputError("--per-request-in-prediction", "needs --capture-per-request")
    if args.output_dir is None:
        return _run(args, t0, signals, None)
    from aisim.simulator.metrics.output import OutputTransaction

    out = OutputTransaction(args.output_dir, args.overwrite)
    try:
        with signals.deferred():
            out.open()  # lock, leftovers, writability: all before the run
        return _run(args, t0, signals, out)
    finally:
        with signals.deferred():
            out.close()  # without a commit: the previous outputs stay exactly as they were


def _retune_progress(plan, progress):
    """A line per retune window (window k/N, candidates, best so far, the outcome) through the
    terminal progress display (``aisim.progress``: nothing without a terminal or with --format
    json); None when the plan does not retune."""
    if plan.planner is None or plan.planner.retune is None or not progress.active:
        return None
    from aisim.search.retune.sweep import replay_starts_ms
    from aisim.search.retune.windows import windows_launched_by

    rc = plan.planner.retune
    starts = replay_starts_ms(plan.traffic.workload, plan.traffic.arrivals.delay_scale)
    total = len(windows_launched_by(float(starts.max()) if len(starts) else 0.0, rc.interval_seconds, rc.grace_seconds))

    def show(k: int, answer) -> None:
        scored = [c for c in answer.candidates if c.get("score") is not None]
        top = max(scored, key=lambda c: c["score"], default=None)
        best = ""
        if top is not None and answer.improvement_pct is not None:
            point = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in top["point"].items())
            best = f", best {answer.improvement_pct:+.1f}% ({point})"
        progress.log(f"retune window {k + 1}/{max(total, k + 1)}: {len(answer.candidates)} candidates on "
                     f"{answer.num_requests} requests{best} -> {answer.outcome} ({answer.sweep_wall_s:.1f} s)")
        progress.steps("retune", k + 1, max(total, k + 1), "windows swept")

    return show


@contextmanager
def _gc_off():
    """No garbage collection while a command sets up: importing, validating the config and
    reading the trace build about a million objects and no cycles worth collecting (the
    collector's scans are ~7% of that time)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _run(args, t0: float, signals: _Signals, out) -> int:
    with _gc_off():
        from aisim.progress import Progress
        from aisim.simulator.config.loading import load_config
        from aisim.simulator.metrics.csv_out import write_csv_outputs
        from aisim.simulator.metrics.output import atomic_write_chunks, atomic_write_text, canonical_json, write_resource_runtime
        from aisim.simulator.metrics.records import jsonl_chunks
        from aisim.simulator.metrics.table import render_table
        from aisim.simulator.metrics.timeline import write_csv as write_timeline_csv
        from aisim.simulator.plan import plan_from_config
        from aisim.simulator.run import run_plan
        from aisim.simulator.runtime.resources import (
            InitWatchdog,
            ResourceGuard,
            apply_cpu_limit,
            memory_limit_bytes,
            peak_rss_bytes,
            set_phase,
        )

        cfg, config_dir = load_config(args.config, args.overrides + _execution_overrides(args), default_path=QUICKSTART)
    res = cfg.execution.resources
    apply_cpu_limit(res)
    label = f"aisim {args.command}"
    guard = ResourceGuard(memory_limit_bytes(res), label=label)
    watchdog = InitWatchdog(res.initialization_timeout_seconds, started_at=t0, label=label)

    def finish(status: str, reason: str | None, code: int, peak: int) -> None:
        """Record how the run ended, then put the outputs in place."""
        write_resource_runtime(out.staging, status, reason, code, guard.limit_bytes, peak, time.perf_counter() - t0)
        signals.finish()  # from here a signal no longer changes the outcome
        out.commit()

    def limited(exc) -> None:
        # the resource report of a run that ended at its limit; never over a previous run's outputs
        if out is not None and not out.committed and not out.has_previous_outputs:
            finish("resource_limited", str(exc), 3, max(guard.peak_observed, peak_rss_bytes()))

    guard.on_hard_exit = limited  # last resort (main thread unresponsive): record, then exit 3
    try:
        with guard:  # the memory limit from here on, loading included; already over it: exit 3 now
            with watchdog:  # initialisation bounded from t0: exit 124 when the limit passes
                set_phase("loading the trace")
                # --csv needs the per-request records and the timelines (prediction.json shows neither)
                from aisim.simulator.traffic.traces import rows_read

                with _gc_off(), Progress.for_command(args) as loading, rows_read(loading.loading):
                    loading.loading(None, None)
                    plan = plan_from_config(cfg, config_dir, args.capture_per_request or args.csv or args.report,
                                            capture_worker_timeline=args.capture_worker_timeline or args.csv or args.report)
                set_phase("starting the actors")
                guard.on_next_check(watchdog.stop)  # the coordinator's first check: the replay runs
                guard.on_next_check(lambda: set_phase("replaying"))
                with Progress.for_command(args) as progress:
                    report = run_plan(plan, guard, on_sweep=_retune_progress(plan, progress), on_progress=progress.replay)
    except Exception as exc:
        if getattr(exc, "exit_code", 1) == 3:
            limited(exc)
        raise
    failure, warning = _outcome(report.summary)
    code = 1 if failure else 0
    if out is not None:
        doc = report.to_dict(with_records=args.per_request_in_prediction)
        if (args.csv or args.report) and not args.capture_per_request:  # captured for --csv/--report only: prediction.json as without it
            doc["per_request"] = None
            doc["coverage"] = {**doc["coverage"], "capture_per_request": False, "per_request_records": 0}
        elif report.per_request is not None and not args.per_request_in_prediction:
            doc["per_request"] = {"path": "requests.jsonl", "records": len(report.per_request)}  # one copy
        atomic_write_text(out.staging / "prediction.json", canonical_json(doc) + "\n")
        if args.capture_per_request and report.per_request is not None:
            atomic_write_chunks(out.staging / "requests.jsonl", jsonl_chunks(report.per_request))
        if args.csv:
            write_csv_outputs(out.staging, report.per_request, report.timelines, report.planner)
        elif report.timelines is not None and args.capture_worker_timeline:
            write_timeline_csv(out.staging / "worker_timeline.csv", report.timelines)
        if args.report:
            from aisim.simulator.metrics.report_html import render_report_html

            sla = cfg.evaluation.sla.model_dump()
            atomic_write_text(out.staging / "report.html",
                              render_report_html(report.summary, report.per_request or [], report.timelines,
                                                 report.planner, cfg.model_dump(mode="json"), sla))
    if args.format == "json":
        text = canonical_json(report.summary, indent=None)
        if not _encodable(text, sys.stdout):
            text = canonical_json(report.summary, indent=None, ensure_ascii=True)
    else:
        text = render_table(report.summary, runtime=report.diagnostics.get("runtime"), planner=report.planner,
                            width=_terminal_width(sys.stdout))
        if out is not None:
            text += f"\nSaved full report to: {args.output_dir / 'prediction.json'}"
    stdout_error = None
    try:
        sys.stdout.write(_for_stream(text, sys.stdout) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError, UnicodeError) as exc:  # a closed pipe, a closed stream
        stdout_error = f"could not write the report to stdout: {exc}"
        _silence_stdout()
        code = 1
    if out is not None:
        peak = max(guard.peak_observed, peak_rss_bytes())
        finish("failed" if code else "completed", failure or stdout_error, code, peak)
    if failure or stdout_error:
        sys.stderr.write(f"aisim {args.command} failed: {failure or stdout_error}\n")
    elif warning:
        sys.stderr.write(f"aisim {args.command}: warning: {warning}\n")
    return code


def _trace(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim trace convert``: one summary line on stdout."""
    from aisim.simulator.errors import InputError
    from aisim.simulator.traffic import convert

    if (args.split_at_seconds is None) != (args.history_out is None):
        flag, other = ("--split-at-seconds", "--history-out") if args.history_out is None else \
            ("--history-out", "--split-at-seconds")
        raise InputError(flag, f"needs {other}: give both (history before the split, replay from it) or neither")
    converter = getattr(convert, TRACE_CONVERSIONS[(args.from_format, args.to_format)])
    try:
        counts = converter(args.input, args.output, args.block_size, args.split_at_seconds, args.history_out,
                           on_commit=signals.finish)  # once the files are complete, a signal changes nothing
    except InputError as exc:
        if exc.where not in _CONVERT_ARGS:
            raise
        raise type(exc)(_CONVERT_ARGS[exc.where], exc.message, category=exc.category) from None
    if args.history_out is None:
        text = f"wrote {counts['out']:,} requests to {args.output} ({args.to_format}, block size {counts['block_size']})"
    else:
        s = f"{args.split_at_seconds:g} s"
        text = (f"wrote {counts['out']:,} requests to {args.output} (from {s}) and {counts['history']:,} to "
                f"{args.history_out} (before {s}); {args.to_format}, block size {counts['block_size']}")
    try:
        sys.stdout.write(_for_stream(text, sys.stdout) + "\n")
        sys.stdout.flush()
    except (OSError, ValueError, UnicodeError) as exc:  # a closed pipe, a closed stream
        _silence_stdout()
        sys.stderr.write(f"aisim trace convert failed: could not write the summary to stdout: {exc}\n")
        return 1
    return 0


def _compare(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim compare``."""
    from aisim.compare import main_compare

    sys.stdout.write(main_compare(args.dirs, args.format, report=args.report) + "\n")
    return 0


def _validate(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim validate``: the resolved config, nothing replayed."""
    import json

    from aisim.validate import render, validate_config_file

    report = validate_config_file(args.config, args.overrides)
    text = json.dumps(report, sort_keys=True, default=str) if args.format == "json" else render(report)
    sys.stdout.write(text + "\n")
    return 0


def _prepare_local_workers(args) -> None:
    """A search on the local backend: start the worker zygote now (unless ``_start_zygote_early``
    did), so it imports the simulator and what the command's trials import while this process
    loads the config (search.zygote)."""
    if args.ray_address is None and args.backend in (None, "local"):
        from aisim.search.zygote import prepare

        prepare(_ZYGOTE_SEARCHES[args.command])


def _capacity(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim capacity``: exit 0, or 1 when a job errored."""
    import json

    _prepare_local_workers(args)
    from aisim.search.capacity.runner import run_capacity_search
    from aisim.simulator.errors import InputError

    _check_kind(args, "capacity")
    for flag, value in (("--max-iterations", args.max_iterations), ("--max-parallel", args.max_parallel)):
        if value is not None and value < 1:
            raise InputError(flag, f"must be >= 1, got {value}")
    for flag, value in (("--min-search-granularity-pct", args.min_search_granularity_pct),
                        ("--max-qps-cap", args.max_qps_cap)):
        if value is not None and not value > 0:
            raise InputError(flag, f"must be > 0, got {value:g}")
    out = args.output_dir
    if (out / "capacity_search_results.json").exists() and not args.overwrite:
        raise InputError("--output-dir", f"{out} already holds capacity_search_results.json; pass --overwrite to "
                                         "replace it (earlier trials are reused from the cache either way)")
    backend = "ray" if args.ray_address else args.backend

    from aisim.progress import Progress

    with Progress.for_command(args) as bar:
        def progress(ev: dict) -> None:
            verdict = "timed out" if ev["timed_out"] else {True: "pass", False: "fail", None: "done"}[ev["passed"]]
            bar.steps("capacity", ev["trials"], None, f"trials; last: {ev['job']} @ {ev['qps']:g} QPS {verdict}")

        result = run_capacity_search(
            args.config, out, backend=backend, ray_address=args.ray_address, max_parallel=args.max_parallel,
            cache_dir=args.cache_dir, use_cache=not args.no_cache, progress=progress if bar.active else None,
            overrides=args.overrides, report=args.report,
            search_overrides={"max_iterations": args.max_iterations,
                              "min_search_granularity_pct": args.min_search_granularity_pct,
                              "max_qps_cap": args.max_qps_cap})
    if args.format == "json":
        sys.stdout.write(json.dumps({"jobs": [{k: v for k, v in j.to_dict().items() if k != "search_trace"}
                                              for j in result.jobs], "output_dir": str(out)}, sort_keys=True) + "\n")
    else:
        for j in result.jobs:
            best = "null" if j.max_qps_under_sla is None else f"{j.max_qps_under_sla:g}"
            tail = f"error: {j.error}" if j.error else f"{j.num_trials} trials, {j.stopped}"
            sys.stdout.write(f"{j.job_name} ({j.mode}): max QPS under SLA {best} ({tail})\n")
        sys.stdout.write(f"wrote {out / 'capacity_search_results.json'}, capacity_search_results.csv"
                         f"{', capacity_report.html' if args.report else ''} and jobs/\n")
    if result.failed:
        sys.stderr.write("aisim capacity: a job failed (see its error above)\n")
        return 1
    return 0


def _has_dgd(args) -> bool:
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping

    return apply_overrides(read_yaml_mapping(args.config, "search config"), list(args.overrides)).get("dgd") is not None


def _print_search_space(args) -> int:
    """``aisim recommend --print-search-space``: the config in the search_space form, as YAML."""
    import yaml

    from aisim.search.spica.reference_form import search_space_form
    from aisim.simulator.config.loading import apply_overrides, read_yaml_mapping

    data = apply_overrides(read_yaml_mapping(args.config, "search config"), list(args.overrides))
    text = yaml.safe_dump(search_space_form(data), sort_keys=False, default_flow_style=None, width=110)
    sys.stdout.write(f"# {args.config} in the search_space form (aisim recommend -c runs the same search)\n{text}")
    return 0


def _recommend(args, t0: float, signals: _Signals) -> int:
    """Run ``aisim recommend``."""
    if not args.print_search_space:
        _prepare_local_workers(args)
    from aisim.search.spica.loop import STUDY_FILE, run_search
    from aisim.simulator.errors import InputError

    _check_kind(args, "recommend")
    if args.print_search_space:
        return _print_search_space(args)
    if args.output_dir is None:
        raise InputError("--output-dir", "is required: name the directory for the study and the recommendation")
    if args.parallelism is not None and args.parallelism < 1:
        raise InputError("--parallelism", f"must be >= 1, got {args.parallelism}")
    out = args.output_dir
    if args.resume and args.storage is None and not (out / STUDY_FILE).exists():
        sys.stderr.write(f"aisim recommend: no earlier study in {out}; starting a new one\n")
    backend = "ray" if args.ray_address else args.backend
    if args.output == "dgd":  # --output dgd without a dgd section: the defaults
        args.overrides = [*args.overrides, "dgd={name: spica}"] if not _has_dgd(args) else args.overrides

    from aisim.progress import Progress

    with Progress.for_command(args) as bar:
        def progress(snap: dict) -> None:
            best = "-" if snap["best"] is None else f"{snap['best']:.4g}"
            pruned = f"{snap['counts']['pruned']} pruned, " if "pruned" in snap["counts"] else ""
            bar.steps("recommend", snap["done"], snap["total"], f"trials, {snap['feasible']} feasible, {pruned}"
                                                               f"best {best}, {snap['trials_per_s']:.2f} trials/s")

        result = run_search(args.config, out, resume=args.resume, overwrite=args.overwrite, backend=backend,
                            ray_address=args.ray_address,
                            parallelism=args.parallelism, storage=args.storage, overrides=args.overrides,
                            progress=progress if bar.active else None, report=args.report)
    best = result.best
    if args.format == "json":
        import json

        line = {"counts": result.counts, "best": None if best is None else
                {k: best.get(k) for k in ("candidate_id", "score", "objectives", "used_gpus", "config")},
                "not_feasible": result.reasons, "decided": result.decided is None, "output_dir": str(out)}
        sys.stdout.write(json.dumps(line, sort_keys=True) + "\n")
    else:
        from aisim.search.spica.summary import count_parts, front_table, reason_line, winner_lines

        c = result.counts
        lines = [f"evaluated {c['evaluated']} candidates ({count_parts(c)}), {c['cache_hits']} duplicate suggestions"]
        why = reason_line(result.reasons)
        if why:
            lines.append(why)
        searched = result.recommendation["provenance"]["config"]
        target = searched["optimization"]["target"]
        sla = searched["evaluation"]["sla"]
        if best is not None:
            lines += winner_lines(best, target, sla, str(out / "recommendations" / "0000.yaml"))
        if target == "pareto":
            by_id = {x["candidate_id"]: x for x in result.recommendation["candidates"]}
            lines += front_table([by_id[i] for i in result.recommendation["views"]["pareto_front"]])
        lines.append(f"wrote {out / 'recommendation.json'}, recommendation.csv"
                     f"{', recommendation.html' if args.report else ''} and recommendations/ (study: {result.storage})")
        lines += [f"wrote {path}" for path in result.dgd_paths]
        sys.stdout.write("\n".join(_for_stream(x, sys.stdout) for x in lines) + "\n")
    if result.decided is not None:
        sys.stderr.write(f"aisim recommend: {result.decided}\n")
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()  # the command starts now, however long ago this module was imported
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if args.command == "trace" and args.action is None:
        args.trace_help()
        return 2
    name = args.command if getattr(args, "action", None) is None else f"{args.command} {args.action}"
    debug = os.environ.get("AISIM_DEBUG") == "1"
    with _Signals() as signals:
        try:
            run = {"trace": _trace, "recommend": _recommend, "capacity": _capacity,
                   "validate": _validate, "compare": _compare}.get(args.command, _predict)
            return run(args, t0, signals)
        except KeyboardInterrupt as exc:  # SIGINT or SIGTERM: nothing half-written, the previous outputs kept
            code, what = _INTERRUPT_EXIT[getattr(exc, "signum", signal.SIGINT)]
            sys.stderr.write(f"aisim: {what}\n")
            return code
        except SystemExit as exc:
            if exc.code == signal.SIGTERM and signals.replaced_sigterm():  # Ray's SIGTERM handler
                code, what = _INTERRUPT_EXIT[signal.SIGTERM]
                sys.stderr.write(f"aisim: {what}\n")
                return code
            raise
        except Exception as exc:  # the CLI turns every error into one line
            code = getattr(exc, "exit_code", 1)
            if debug:
                raise
            if code == 1:
                sys.stderr.write(f"aisim {name} failed: {type(exc).__name__}: {exc}\n")
            else:
                sys.stderr.write(f"aisim {name}: error: {exc}\n")
            return code


# searches whose local workers come from a zygote (search.zygote), and its preload
_ZYGOTE_SEARCHES = {"capacity": "capacity", "recommend": "spica"}


def _start_zygote_early(args: list[str]) -> None:
    """A local capacity or recommend run starts its worker zygote first thing, before the flags
    are parsed (~0.05 s sooner than the command itself would: the zygote's imports are what its
    first trials wait for). Plainly local runs only: anything naming Ray (``--ray-address``,
    ``--backend`` other than local, abbreviations included) or asking for help waits for the
    parsed flags (``_prepare_local_workers``, which finds a zygote started here)."""
    search = _ZYGOTE_SEARCHES.get(args[0]) if args else None
    if search is None:
        return
    for i, a in enumerate(args[1:], 1):
        name, eq, value = a.partition("=")
        if a in ("-h", "--help") or (len(name) >= 4 and "--ray-address".startswith(name)):
            return
        if len(name) >= 4 and "--backend".startswith(name):
            if (value if eq else (args[i + 1] if i + 1 < len(args) else "")) != "local":
                return
    try:
        from aisim.search.zygote import prepare

        prepare(search)
    except Exception:  # noqa: BLE001 - the command's own start reports it, in one line
        pass


# commands whose process may end without the interpreter's teardown (``run``): they keep no
# study storage, and what worker processes they start (a capacity search's lanes and zygote)
# are closed by the command or by the exit handlers that still run
_FAST_EXIT_COMMANDS = frozenset({"predict", "validate", "compare", "trace", "capacity"})


def run(argv: list[str] | None = None) -> None:
    """The ``aisim`` command (console script and ``python -m aisim``): ``main`` then exit
    (pydantic's plugin discovery off unless ``PYDANTIC_DISABLE_PLUGINS`` is set).

    After a command of ``_FAST_EXIT_COMMANDS`` the process ends without tearing the interpreter
    down (freeing every module and object: ~0.1 s, a sixth of a quickstart run), as mypy does:
    what a normal exit does that anyone can see still happens (the exit handlers run, both
    streams are flushed, the exit code is kept). A normal exit instead when another non-daemon
    thread is alive (a normal exit waits for it), when a stream cannot be flushed (a closed
    pipe: Python's own message and exit code), or with ``AISIM_FULL_EXIT=1``."""
    args = sys.argv[1:] if argv is None else argv
    # pydantic looks for its plugins (observability hooks) by reading the entry points of every
    # installed distribution when the first model is built: ~40 ms of every command, for hooks
    # aisim has no use for. A value the user set is kept (PYDANTIC_DISABLE_PLUGINS= enables them).
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    _start_zygote_early(args)
    code = main(argv)
    if (not args or args[0] not in _FAST_EXIT_COMMANDS or os.environ.get("AISIM_FULL_EXIT") == "1"
            or any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.current_thread())):
        sys.exit(code)
    import atexit

    atexit._run_exitfuncs()  # (they run once: a normal exit after this finds none left)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        sys.exit(code)
    os._exit(code if isinstance(code, int) else 1)


if __name__ == "__main__":  # pragma: no cover
    run()
