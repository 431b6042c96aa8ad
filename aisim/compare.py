"""``aisim compare DIR...``: runs side by side, with deltas against the first run.

Each DIR is an ``aisim predict --output-dir`` directory (holding ``prediction.json``); a
``prediction.json`` path is accepted too. The comparison has one row per metric (``METRICS``:
GPU hours, goodput, TTFT/ITL/E2E mean, p90 and p99, completed and rejected requests, the
Planner's scaling events and retune decisions) and one value per run; every later run also
gets its delta against the first (``value - first``) and that delta in percent of the first.

    result = compare([load_run(Path(d)) for d in dirs])
    print(render_table(result))          # or to_json(result) / to_csv(result)
    print(main_compare(dirs, "table"))   # what the CLI prints

A missing directory, one without prediction.json, an unreadable or invalid prediction.json, or
one without a ``summary`` raises a one-line ``InputError`` (``where`` = the path as given; exit 2).

Wiring into aisim/cli.py (a sketch)::

    cp = sub.add_parser("compare", help="compare aisim predict output directories side by side")
    cp.add_argument("dirs", nargs="+", metavar="DIR")
    cp.add_argument("--format", choices=FORMATS, default="table")
    ...
    def _compare(args, t0, signals):
        from aisim.compare import main_compare
        sys.stdout.write(main_compare(args.dirs, args.format) + "\\n")
        return 0
"""

from __future__ import annotations

import csv
import io
import json
import math
import shutil
from pathlib import Path
from typing import Any

from aisim.simulator.errors import InputError
from aisim.simulator.metrics.planner_summary import PLANNER_METRICS, planner_counts

FORMATS: tuple[str, ...] = ("table", "json", "csv")
PREDICTION = "prediction.json"

# (key, label, unit, better): display order. ``better`` says which direction is an improvement
# ("lower", "higher") or None where neither is (counts of Planner activity). A dotted key reads a
# nested summary field (``kv_tiers.reuse...``: only runs with a KV tier have it).
METRICS: tuple[tuple[str, str, str, str | None], ...] = (
    ("gpu_hours", "GPU hours", "h", "lower"),
    ("goodput_output_throughput_tok_s", "goodput output", "tok/s", "higher"),
    ("goodput_request_throughput_rps", "goodput requests", "req/s", "higher"),
    ("mean_ttft_ms", "TTFT mean", "ms", "lower"),
    ("p90_ttft_ms", "TTFT p90", "ms", "lower"),
    ("p99_ttft_ms", "TTFT p99", "ms", "lower"),
    ("mean_itl_ms", "ITL mean", "ms", "lower"),
    ("p90_itl_ms", "ITL p90", "ms", "lower"),
    ("p99_itl_ms", "ITL p99", "ms", "lower"),
    ("mean_e2e_latency_ms", "E2E mean", "ms", "lower"),
    ("p90_e2e_latency_ms", "E2E p90", "ms", "lower"),
    ("p99_e2e_latency_ms", "E2E p99", "ms", "lower"),
    ("prefix_cache_reused_ratio", "prefix reuse", "of input", "higher"),
    ("kv_tiers.reuse.first_admission_host_ratio", "host reuse, first admission", "of input", "higher"),
    ("completed_requests", "completed", "requests", "higher"),
    ("rejected_requests", "rejected", "requests", "lower"),
    ("scaling_events", "scaling events", "events", None),
    ("scale_ups", "scale-ups", "events", None),
    ("scale_downs", "scale-downs", "events", None),
    ("worker_starts", "worker starts", "workers", None),
    ("retune_decisions", "retune decisions", "decisions", None),
    ("retune_applied", "retune applied", "decisions", None),
)

_FIX = "give an `aisim predict --output-dir DIR` directory"


class CompareError(InputError):
    """A path given to ``aisim compare`` is not a readable run directory (exit code 2)."""


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def load_run(path: Path) -> dict:
    """``{"name": str(path), "summary": {...}, "planner": {...} | None}`` for one run directory
    (or a prediction.json path). Raises ``CompareError`` (an ``InputError``, where = the path)
    when it is missing, holds no prediction.json, or its prediction.json is unreadable, not JSON,
    or has no ``summary`` mapping."""
    path = Path(path)
    where = str(path)
    if not path.exists():
        raise CompareError(where, f"no such directory; {_FIX}")
    file = path / PREDICTION if path.is_dir() else path
    if path.is_dir() and not file.is_file():
        raise CompareError(where, f"holds no {PREDICTION}, so it is not an aisim predict output directory; {_FIX}")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise CompareError(where, f"cannot read {file.name}: {_one_line(detail)}; check the file's permissions "
                                  f"or rerun aisim predict --output-dir to rewrite it") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(where, f"{file.name} is not valid JSON ({_one_line(exc.msg)} at line {exc.lineno} "
                                  f"column {exc.colno}); rerun aisim predict --output-dir to rewrite it") from exc
    if not isinstance(data, dict) or not isinstance(data.get("summary"), dict):
        raise CompareError(where, f'{file.name} has no "summary" mapping, so it is not an aisim predict '
                                  f"prediction; {_FIX}")
    planner = data.get("planner")
    if planner is not None and not isinstance(planner, dict):
        raise CompareError(where, f'{file.name}\'s "planner" is neither a mapping nor null; '
                                  f"rerun aisim predict --output-dir to rewrite it")
    return {"name": where, "summary": data["summary"], "planner": planner}


def _number(v: Any) -> int | float | None:
    """``v`` when it is a finite number (not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _field(summary: dict, key: str) -> Any:
    """``summary[key]``, a dotted key followed through nested mappings (None where one is missing)."""
    v: Any = summary
    for part in key.split("."):
        if not isinstance(v, dict):
            return None
        v = v.get(part)
    return v


def _flat(d: Any, prefix: str, out: dict) -> dict:
    """Nested mappings as ``{dotted path: leaf value}``."""
    if isinstance(d, dict):
        for k, v in d.items():
            _flat(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = d
    return out


# the parts of a run's summary that say what it ran (compared as settings, not as metrics)
SETTINGS: tuple[str, ...] = ("deployment", "prediction_provenance")


def settings_that_differ(runs: list[dict]) -> list[dict]:
    """``[{"setting": dotted path, "values": [one per run, None where absent]}]`` for every leaf
    of the runs' ``summary.deployment`` and ``summary.prediction_provenance`` that is not the same
    in all of them, in the first run's order (then the others' new paths)."""
    flats = [{} for _ in runs]
    for flat, run in zip(flats, runs):
        for part in SETTINGS:
            _flat(run["summary"].get(part), part, flat)
    order = list(dict.fromkeys(k for flat in flats for k in flat))
    out = []
    for key in order:
        values = [flat.get(key) for flat in flats]
        if any(v != values[0] for v in values[1:]):
            out.append({"setting": key, "values": values})
    return out


def _clean(x: float | int) -> float | int:
    """Round float noise away (0.3 - 0.1 -> 0.2): 12 significant digits; ints unchanged."""
    return x if isinstance(x, int) else float(f"{x:.12g}")


def compare(runs: list[dict]) -> dict:
    """``{"runs": [names], "rows": [{"metric", "label", "unit", "better", "values", "deltas",
    "delta_pct"}], "settings": settings_that_differ(runs)}``. ``deltas[i] = values[i] - values[0]``
    and ``delta_pct[i]`` is that in percent of ``|values[0]|`` (both None for the first run and
    where a value is missing; the percentage also where the first value is 0)."""
    if not runs:
        raise CompareError("aisim compare", f"no runs to compare; {_FIX} (one or more)")
    planners = [planner_counts(r.get("planner")) for r in runs]
    rows = []
    for key, label, unit, better in METRICS:
        if key in PLANNER_METRICS:
            values = [p[key] for p in planners]
        else:
            values = [_number(_field(r["summary"], key)) for r in runs]
        first = values[0]
        deltas: list = [None]
        pcts: list = [None]
        for v in values[1:]:
            if v is None or first is None:
                deltas.append(None)
                pcts.append(None)
                continue
            deltas.append(_clean(v - first))
            pcts.append(None if first == 0 else _clean((v - first) / abs(first) * 100.0))
        rows.append({"metric": key, "label": label, "unit": unit, "better": better,
                     "values": values, "deltas": deltas, "delta_pct": pcts})
    return {"runs": [r["name"] for r in runs], "rows": rows, "settings": settings_that_differ(runs)}


# ---- rendering ---------------------------------------------------------------------------------

def _decimals(v: float) -> int:
    """Decimals for a float of this size: 1 from 100 up, 2 from 1 up, 3 significant digits below."""
    a = abs(v)
    if a >= 100:
        return 1
    if a >= 1 or a == 0:
        return 2
    return max(3, 2 - math.floor(math.log10(a)))


def fmt_value(v: int | float | None, sign: bool = False, like: int | float | None = None) -> str:
    """``-`` for None; ints with thousands separators; floats with ``_decimals`` of ``like`` (the
    value itself by default; a delta is written to its value's precision). ``sign`` adds + to
    positive numbers (for deltas)."""
    if v is None:
        return "-"
    plus = "+" if sign else ""
    if isinstance(v, int):
        return f"{v:{plus},d}"
    return f"{v:{plus},.{_decimals(v if like is None else like)}f}"


def fmt_cell(value, delta, pct, first: bool) -> str:
    """A run's cell: the value, and for a later run its delta vs the first:
    ``1.23 (+0.10, +8.8%)``, ``1.23 (+0.10)`` without a percentage, ``1.23 (=)`` when equal."""
    text = fmt_value(value)
    if first or value is None or delta is None:
        return text
    if delta == 0:
        return f"{text} (=)"
    if pct is None:
        return f"{text} ({fmt_value(delta, sign=True, like=value)})"
    return f"{text} ({fmt_value(delta, sign=True, like=value)}, {pct:+.1f}%)"


def _metric_label(row: dict) -> str:
    return f"{row['label']} ({row['unit']})" if row["unit"] else row["label"]


def render_table(result: dict, width: int = 100) -> str:
    """Plain text, no trailing newline. Side by side (a metric column, then one column per run)
    when that fits ``width`` columns; otherwise one block per run, stacked."""
    names = result["runs"]
    labels = [_metric_label(r) for r in result["rows"]]
    cells = [[fmt_cell(v, d, p, i == 0) for i, (v, d, p) in enumerate(zip(r["values"], r["deltas"], r["delta_pct"]))]
             for r in result["rows"]]
    footer = f"deltas: each run minus the first ({names[0]})" if len(names) > 1 else None
    label_w = max(len("metric"), *(len(s) for s in labels))
    col_ws = [max(len(name), *(len(row[i]) for row in cells)) for i, name in enumerate(names)]
    gap = "  "
    total = label_w + sum(len(gap) + w for w in col_ws)
    if total <= width:
        lines = [f"{'metric':<{label_w}}" + "".join(f"{gap}{n:>{w}}" for n, w in zip(names, col_ws))]
        lines.append("-" * total)
        for label, row in zip(labels, cells):
            lines.append(f"{label:<{label_w}}" + "".join(f"{gap}{c:>{w}}" for c, w in zip(row, col_ws)))
    else:  # stacked: one block per run
        lines = []
        for i, name in enumerate(names):
            if i:
                lines.append("")
            lines.append(f"run {i + 1}: {name}" + (" (vs run 1)" if i else ""))
            for label, row in zip(labels, cells):
                lines.append(f"  {label:<{label_w}}{gap}{row[i]}")
    if footer:
        lines.extend(["", footer])
    settings = result.get("settings")
    if settings:
        lines.extend(["", "settings that differ:"])
        for st in settings:
            lines.append(f"  {st['setting']}: " + " | ".join("-" if v is None else str(v) for v in st["values"]))
    return "\n".join(lines)


def to_json(result: dict) -> str:
    """The comparison as indented JSON (no trailing newline); missing values are null."""
    return json.dumps(result, indent=2)


def to_csv(result: dict) -> str:
    """``metric,label,unit,<run1>,<run2>,...,delta_<run2>,...,delta_pct_<run2>,...`` (one row per
    metric; missing values empty; numbers as Python writes them; the settings that differ are in
    the table and JSON forms only). No trailing newline."""
    names = result["runs"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["metric", "label", "unit", *names, *(f"delta_{n}" for n in names[1:]),
                *(f"delta_pct_{n}" for n in names[1:])])
    for r in result["rows"]:
        w.writerow([r["metric"], r["label"], r["unit"],
                    *("" if v is None else v for v in r["values"]),
                    *("" if v is None else v for v in r["deltas"][1:]),
                    *("" if v is None else v for v in r["delta_pct"][1:])])
    return buf.getvalue()[:-1]


def load_latencies(path: Path) -> dict[str, list[float]] | None:
    """Per-request TTFT / ITL / E2E of a run's completed requests (arrival order), from its
    ``requests.jsonl`` or the records inside prediction.json; None when it kept neither."""
    path = Path(path)
    run_dir = path if path.is_dir() else path.parent
    rows = None
    jsonl = run_dir / "requests.jsonl"
    try:
        if jsonl.is_file():
            rows = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines() if line.strip()]
        else:
            per = json.loads((run_dir / PREDICTION if path.is_dir() else path).read_text(encoding="utf-8")).get("per_request")
            rows = per if isinstance(per, list) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompareError(str(path), f"cannot read its request records ({_one_line(exc)}); rerun aisim predict "
                                      "--output-dir to rewrite them") from exc
    if rows is None:
        return None
    done = [r for r in rows if isinstance(r, dict) and r.get("terminal_status") == "completed"]
    out = {}
    for name, field in (("ttft", "ttft_ms"), ("itl", "itl_ms"), ("e2e", "e2e_latency_ms")):
        out[name] = [float(r[field]) for r in done if _number(r.get(field)) is not None]
    return out


def write_compare_report(runs: list[dict], paths: list[str], file: Path, width: int = 100) -> None:
    """``aisim compare --report FILE``: the overlay page of the runs' (``load_run``) distributions
    and replica curves (``simulator.metrics.report_html.render_compare_html``), written atomically."""
    from aisim.simulator.metrics.output import atomic_write_text
    from aisim.simulator.metrics.report_html import render_compare_html, require_matplotlib

    require_matplotlib("--report")
    file = Path(file)
    if not file.parent.is_dir():
        raise CompareError("--report", f"{file.parent} is not a directory; create it or pick another path")
    runs = [dict(run, latencies=load_latencies(Path(p))) for run, p in zip(runs, paths)]
    atomic_write_text(file, render_compare_html(runs, render_table(compare(runs), width)))


def traffic_warning(runs: list[dict]) -> str | None:
    """One line when the runs replayed different traffic (request count or ``traffic_digest``
    differ; a run without a digest, written by an older aisim, is compared by count alone)."""
    first = runs[0]["summary"]
    for run in runs[1:]:
        s = run["summary"]
        if s.get("num_requests") != first.get("num_requests"):
            return (f"the runs replayed different traffic: {runs[0]['name']} offered {first.get('num_requests')} "
                    f"requests, {run['name']} {s.get('num_requests')}; the deltas compare different workloads")
        a, b = first.get("traffic_digest"), s.get("traffic_digest")
        if a and b and a != b:
            return (f"the runs replayed different traffic: {runs[0]['name']} and {run['name']} offered "
                    f"{s.get('num_requests')} requests each, but not the same ones (traffic_digest {a} vs {b}); "
                    "the deltas compare different workloads")
    return None


def main_compare(paths: list[str], fmt: str = "table", width: int | None = None, report: Path | None = None) -> str:
    """What ``aisim compare`` prints (without the final newline). Loads every path (the first bad
    one raises its one-line ``InputError``), compares them and renders ``fmt``; ``width`` defaults
    to the terminal's width (100 when it is not a terminal). ``report``: also write the HTML
    overlay there (``write_compare_report``)."""
    if fmt not in FORMATS:
        raise CompareError("--format", f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
    runs = [load_run(Path(p)) for p in paths]
    warning = traffic_warning(runs) if len(runs) > 1 else None
    if warning:
        import sys

        sys.stderr.write(f"aisim compare: warning: {warning}\n")
    if report is not None:
        write_compare_report(runs, paths, report)
    result = compare(runs)
    if fmt == "json":
        return to_json(result)
    if fmt == "csv":
        return to_csv(result)
    if width is None:
        width = shutil.get_terminal_size((100, 24)).columns
    return render_table(result, width)
