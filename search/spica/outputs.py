"""Spica's ledger and output files (reference §7.7).

- ``candidate_record``: one ledger entry (``candidate-NNNNNN``, status, the unrolled ``config``, the
  concrete ``prediction_config``, ``used_gpus``, ``score``, ``metrics``, ``objectives``, reason,
  ``provenance``). ``score`` is the signed value (a number; a list for ``pareto``), null unless the
  candidate is feasible. ``metrics`` keeps the replay summary's scalar fields, less the host
  wall-clock ones (``simulator.metrics.summary.WALL_TIME_FIELDS``), so a replay of the recorded
  ``prediction_config`` reproduces them exactly.
- ``build_recommendation``: ``recommendation.json``'s document (schema ``1.1``): the candidates in
  rank order (``search.spica.objectives.rank_key``), ``views.top_n`` (the ids of the best ``top_n``
  feasible candidates) and ``views.pareto_front`` (the front's ids for ``pareto``, else []),
  ``counts`` and ``provenance``. ``candidate_retention``: ``all`` keeps every record, ``feasible`` the
  feasible ones, ``views`` only those named in a view.
- ``write_outputs``: ``recommendation.json`` (canonical JSON: sorted keys, indent 2, NaN/inf ->
  null, trailing newline), ``recommendation.csv`` (one row per retained candidate in rank order:
  ``rank`` (1-based over the feasible rows, empty otherwise), ``candidate_id``, ``status``,
  ``used_gpus``, ``score``, ``reason_category``, ``reason``, then ``objectives.*``, ``metrics.*``,
  ``config.*``, ``provenance.*`` flattened with dotted names, each section's columns sorted; null ->
  empty cell, booleans ``true``/``false``, lists as compact JSON) and ``recommendations/NNNN.yaml``
  (the ``prediction_config`` of every feasible retained candidate in rank order, deduplicated by
  canonical JSON, ``0000.yaml`` = the winner; ``NNNN.yaml`` files of an earlier run beyond the new
  count are removed). Every file is written atomically (temporary sibling + ``os.replace``).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml

from aisim import __version__
from aisim.search.spica.objectives import TARGETS, Score, pareto_front, rank_key
from aisim.simulator.metrics.output import atomic_write_text, canonical_json, discard
from aisim.simulator.metrics.summary import WALL_TIME_FIELDS

SCHEMA_VERSION = "1.1"
IMPLEMENTATION = "aisim"
STATUSES = ("feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited", "pruned")
REASON_CATEGORIES = ("gpu_budget", "kv_capacity", "sla_constraint", "load_constraint", "backend_topology",
                     "runtime_timeout", "resource_limit", "candidate_materialization", "replay_runtime",
                     "runner_contract", "invalid_metrics", "no_samples", "parallel_projection",
                     "adapter_constraint", "pruned", "unknown")
COUNT_KEYS = ("evaluated", "feasible", "infeasible", "unsupported", "timed_out", "failed", "resource_limited",
              "cache_hits", "pruned")
OPTIONAL_COUNTS = ("pruned",)  # written only when the search counts them (a search with a pruner)
RETENTIONS = ("all", "feasible", "views")
SEARCH_STRATEGIES = ("exhaustive", "optimizer_guided")
CSV_LEADING = ("rank", "candidate_id", "status", "used_gpus", "score", "reason_category", "reason")
CSV_SECTIONS = ("objectives", "metrics", "config", "provenance")
_YAML_NAME = re.compile(r"\d{4,}\.yaml")


def format_candidate_id(n: int) -> str:
    return f"candidate-{n:06d}"


def record_metrics(summary: Mapping | None) -> dict | None:
    """The summary's scalar fields (no maps such as ``rejection_reasons`` or
    ``prediction_provenance``), less the wall-clock ones, in the summary's order."""
    if summary is None:
        return None
    return {k: v for k, v in summary.items()
            if k not in WALL_TIME_FIELDS and (v is None or isinstance(v, (bool, int, float, str)))}


def candidate_record(candidate_id: int, status: str, config: dict, prediction_config: dict | None,
                     used_gpus: int | None, score: Score | None, metrics: dict | None, reason_category: str | None,
                     reason: str | None, provenance: dict, pruned: dict | None = None) -> dict:
    """One ledger entry. A feasible record needs a scored ``score``; any other status records a null
    score (its objectives, when computed, stay). A null ``reason_category`` / ``reason`` falls back to
    the score's. ``pruned``: where a pruned candidate stopped (``search.spica.pruning``), kept as
    the record's ``pruned``."""
    if status not in STATUSES:
        raise ValueError(f"unknown candidate status {status!r}; expected one of {', '.join(STATUSES)}")
    if score is not None:
        reason_category = reason_category if reason_category is not None else score.reason_category
        reason = reason if reason is not None else score.reason
    if reason_category is not None and reason_category not in REASON_CATEGORIES:
        raise ValueError(f"unknown reason_category {reason_category!r}")
    values = score.values if score is not None else None
    if status == "feasible":
        if values is None:
            raise ValueError("a feasible candidate needs a scored Score")
        if reason_category is not None:
            raise ValueError("a feasible candidate has no reason_category")
    else:
        values = None
    return {
        "candidate_id": format_candidate_id(candidate_id),
        "status": status,
        "config": config,
        "prediction_config": prediction_config,
        "used_gpus": used_gpus,
        "score": None if values is None else (values[0] if len(values) == 1 else list(values)),
        "metrics": record_metrics(metrics),
        "objectives": dict(score.objectives) if score is not None else {},
        "reason_category": reason_category,
        "reason": reason,
        "provenance": provenance,
        **({"pruned": dict(pruned)} if pruned is not None else {}),
    }


def _feasible(c: Mapping) -> bool:
    return c.get("status") == "feasible" and c.get("score") is not None


def build_recommendation(candidates: Sequence[dict], *, target: str, counts: Mapping, search_strategy: str,
                         run_id: str, input_fingerprint: str, config: dict, top_n: int = 10,
                         retention: str = "all", created_at: str | None = None) -> dict:
    """``recommendation.json``'s document. ``counts``: the ``COUNT_KEYS`` (a missing one is 0, an
    absent ``OPTIONAL_COUNTS`` one is left out).
    ``created_at``: ISO-8601 UTC; now when not given."""
    if target not in TARGETS:
        raise ValueError(f"unknown target {target!r}")
    if retention not in RETENTIONS:
        raise ValueError(f"unknown candidate_retention {retention!r}; expected one of {', '.join(RETENTIONS)}")
    if search_strategy not in SEARCH_STRATEGIES:
        raise ValueError(f"unknown search_strategy {search_strategy!r}; expected one of {', '.join(SEARCH_STRATEGIES)}")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise ValueError(f"top_n must be a non-negative integer, got {top_n!r}")
    unknown = sorted(set(counts) - set(COUNT_KEYS))
    if unknown:
        raise ValueError(f"unknown counts keys: {', '.join(unknown)}")
    ids = [c["candidate_id"] for c in candidates]
    if len(set(ids)) != len(ids):
        raise ValueError("duplicate candidate_id in the ledger")

    ranked = sorted(candidates, key=lambda c: rank_key(c, target))
    top = [c["candidate_id"] for c in ranked if _feasible(c)][:top_n]
    front = [c["candidate_id"] for c in pareto_front(ranked, target)] if target == "pareto" else []
    if retention == "feasible":
        kept = [c for c in ranked if _feasible(c)]
    elif retention == "views":
        named = set(top) | set(front)
        kept = [c for c in ranked if c["candidate_id"] in named]
    else:
        kept = ranked
    if created_at is None:
        created_at = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    return {
        "schema_version": SCHEMA_VERSION,
        "candidate_retention": retention,
        "counts": {k: int(counts.get(k, 0)) for k in COUNT_KEYS if k in counts or k not in OPTIONAL_COUNTS},
        "candidates": kept,
        "views": {"top_n": top, "pareto_front": front},
        "provenance": {
            "search_strategy": search_strategy,
            "implementation": IMPLEMENTATION,
            "implementation_version": __version__,
            "run_id": run_id,
            "created_at": created_at,
            "input_fingerprint": input_fingerprint,
            "config": config,
        },
    }


# -- files ---------------------------------------------------------------------------------------
def _flatten(prefix: str, value, out: dict) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _cell(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ""
    if isinstance(v, (list, tuple, Mapping)):
        return canonical_json(v, indent=None)
    return str(v)


def csv_text(candidates: Sequence[Mapping]) -> str:
    """``recommendation.csv`` for candidates already in rank order."""
    rows, columns = [], {s: set() for s in CSV_SECTIONS}
    rank = 0
    for c in candidates:
        row = {k: c.get(k) for k in CSV_LEADING[1:]}
        if _feasible(c):
            rank += 1
            row["rank"] = rank
        for section in CSV_SECTIONS:
            flat: dict = {}
            _flatten(section, c.get(section) or {}, flat)
            columns[section].update(flat)
            row.update(flat)
        rows.append(row)
    header = list(CSV_LEADING) + [k for s in CSV_SECTIONS for k in sorted(columns[s])]
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(header)
    for row in rows:
        out.writerow([_cell(row.get(k)) for k in header])
    return buf.getvalue()


def recommended_configs(candidates: Sequence[Mapping]) -> list[dict]:
    """The feasible candidates' prediction configs in the given (rank) order, first of each
    canonical JSON kept."""
    seen, configs = set(), []
    for c in candidates:
        pc = c.get("prediction_config")
        if not _feasible(c) or pc is None:
            continue
        key = json.dumps(pc, sort_keys=True)
        if key not in seen:
            seen.add(key)
            configs.append(pc)
    return configs


_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's when available: the same text, faster


def yaml_text(prediction_config: Mapping) -> str:
    return yaml.dump(prediction_config, Dumper=_DUMPER, sort_keys=False, default_flow_style=False, allow_unicode=True)


def write_outputs(output_dir: Path, recommendation: Mapping) -> None:
    """Write the three outputs into ``output_dir`` (created when missing); the candidates are taken in
    the order ``build_recommendation`` stored them (rank order). ``recommendation.json`` goes last."""
    output_dir = Path(output_dir)
    rec_dir = output_dir / "recommendations"
    rec_dir.mkdir(parents=True, exist_ok=True)
    candidates = recommendation.get("candidates") or []
    configs = recommended_configs(candidates)
    written = set()
    for i, pc in enumerate(configs):
        name = f"{i:04d}.yaml"
        atomic_write_text(rec_dir / name, yaml_text(pc))
        written.add(name)
    for stale in rec_dir.iterdir():  # an earlier run's surplus recommendations
        if _YAML_NAME.fullmatch(stale.name) and stale.name not in written and stale.is_file():
            discard(stale)
    atomic_write_text(output_dir / "recommendation.csv", csv_text(candidates))
    atomic_write_text(output_dir / "recommendation.json", canonical_json(recommendation) + "\n")
