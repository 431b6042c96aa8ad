"""``aisim`` command line: the composition root (the one module that reaches every layer).

    aisim predict                                   # the bundled quickstart, table on stdout
    aisim predict -c my.yaml --set router.policy=round_robin --output-dir out/

Exit codes: 0 success, 1 execution failure, 2 bad input (config, trace, override, flag),
3 resource limit, 124 initialisation timeout, 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO_CONFIGS = Path(__file__).resolve().parent.parent / "configs"
QUICKSTART = REPO_CONFIGS / "quickstart.yaml"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2, no usage dump)."""

    def error(self, message: str):  # noqa: D102
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="aisim", description="Predict how an LLM inference deployment behaves, before renting the GPUs.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    pr = sub.add_parser("predict", help="replay traffic through simulated workers and report latency/throughput")
    pr.add_argument("-c", "--config", type=Path, default=None, help=f"predict YAML (default: the bundled {QUICKSTART.name})")
    pr.add_argument("--set", dest="overrides", action="append", default=[], metavar="PATH=YAML",
                    help="override a config key before validation, e.g. --set 'planner={policy: disabled}' (repeatable)")
    pr.add_argument("--output-dir", type=Path, default=None,
                    help="write prediction.json (and requests.jsonl) here; without it nothing is written")
    pr.add_argument("--overwrite", action="store_true", help="replace known aisim outputs in a non-empty --output-dir")
    pr.add_argument("--format", choices=("table", "json"), default="table", help="stdout format (default: table)")
    pr.add_argument("--capture-per-request", action="store_true",
                    help="fill prediction.json per_request and write requests.jsonl (needs --output-dir)")
    pr.add_argument("--capture-worker-timeline", action="store_true",
                    help="write worker_timeline.csv: each worker's waiting/running requests and KV usage over "
                         "time (needs --output-dir)")
    pr.add_argument("--backend", choices=("local", "ray"), default=None,
                    help="where the simulated workers, router and Planner live (overrides execution.backend)")
    pr.add_argument("--ray-address", default=None, metavar="auto|HOST:PORT",
                    help="join a running Ray cluster instead of starting a local one (implies --backend ray)")
    return p


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


def _predict(args, t0: float) -> int:
    """Run ``aisim predict``; ``t0`` is the ``time.perf_counter()`` at which the command started (the
    initialisation timeout and the recorded runtime count from it, not from when this module was imported)."""
    from simulator.config.loading import load_config
    from simulator.errors import InitTimeoutError, InputError
    from simulator.metrics.output import (
        atomic_write_lines,
        atomic_write_text,
        canonical_json,
        prepare_output_dir,
        write_resource_runtime,
    )
    from simulator.metrics.table import render_table
    from simulator.metrics.timeline import write_csv as write_timeline_csv
    from simulator.replay import plan_from_config, run_plan
    from simulator.runtime.resources import ResourceGuard, apply_cpu_limit, memory_limit_bytes, peak_rss_bytes

    if args.capture_per_request and args.output_dir is None:
        raise InputError("--capture-per-request", "needs --output-dir to write requests.jsonl")
    if args.capture_worker_timeline and args.output_dir is None:
        raise InputError("--capture-worker-timeline", "needs --output-dir to write worker_timeline.csv")
    cfg, config_dir = load_config(args.config, args.overrides + _execution_overrides(args), default_path=QUICKSTART)
    plan = plan_from_config(cfg, config_dir, args.capture_per_request,
                            capture_worker_timeline=args.capture_worker_timeline)  # every input checked before any output
    out_dir = prepare_output_dir(args.output_dir, args.overwrite) if args.output_dir is not None else None
    res = cfg.execution.resources
    apply_cpu_limit(res)
    guard = ResourceGuard(memory_limit_bytes(res))
    init_s = time.perf_counter() - t0
    if init_s > res.initialization_timeout_seconds:
        raise InitTimeoutError(f"initialisation took {init_s:.1f} s, over execution.resources.initialization_timeout_seconds "
                               f"({res.initialization_timeout_seconds} s); raise it for very large traces")
    try:
        guard.check()
        report = run_plan(plan, guard)
    except Exception as exc:
        if out_dir is not None and getattr(exc, "exit_code", 1) == 3:
            write_resource_runtime(out_dir, "resource_limited", str(exc), 3, guard.limit_bytes, guard.peak_observed,
                                   time.perf_counter() - t0)
        raise
    if out_dir is not None:
        atomic_write_text(out_dir / "prediction.json", canonical_json(report.to_dict()) + "\n")
        if report.per_request is not None:
            atomic_write_lines(out_dir / "requests.jsonl", report.per_request)
        if report.timelines is not None:
            write_timeline_csv(out_dir / "worker_timeline.csv", report.timelines)
        write_resource_runtime(out_dir, "completed", None, 0, guard.limit_bytes,
                               max(guard.peak_observed, peak_rss_bytes()), time.perf_counter() - t0)
    if args.format == "json":
        print(canonical_json(report.summary, indent=None))
    else:
        print(render_table(report.summary, runtime=report.diagnostics.get("runtime")))
        if out_dir is not None:
            print(f"Saved full report to: {out_dir / 'prediction.json'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()  # the command starts now, however long ago this module was imported
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    debug = os.environ.get("AISIM_DEBUG") == "1"
    try:
        return _predict(args, t0)
    except KeyboardInterrupt:
        sys.stderr.write("aisim: interrupted\n")
        return 130
    except Exception as exc:  # the CLI turns every error into one line
        code = getattr(exc, "exit_code", 1)
        if debug:
            raise
        if code == 1:
            sys.stderr.write(f"aisim {args.command} failed: {type(exc).__name__}: {exc}\n")
        else:
            sys.stderr.write(f"aisim {args.command}: error: {exc}\n")
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
