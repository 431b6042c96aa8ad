"""Writing results: canonical JSON, atomic files, the output directory contract."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

from simulator.errors import InputError

#: every file aisim writes into an output directory (``--overwrite`` deletes only these)
KNOWN_OUTPUTS = ("prediction.json", "requests.jsonl", "worker_timeline.csv", "resource-plan.json",
                 "resource-runtime.json")


def _clean(x):
    """NaN/inf -> null so the JSON is standard; recurse into containers."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def canonical_json(obj, indent: int | None = 2) -> str:
    return json.dumps(_clean(obj), sort_keys=True, indent=indent, allow_nan=False, ensure_ascii=False)


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def atomic_write_lines(path: Path, rows) -> None:
    atomic_write_text(path, "".join(canonical_json(r, indent=None) + "\n" for r in rows))


def write_resource_runtime(out_dir: Path, status: str, reason: str | None, exit_code: int,
                           memory_limit_bytes: int | None, peak_rss_bytes: int, wall_seconds: float) -> None:
    """``resource-runtime.json``: how the run ended against its execution.resources budget."""
    doc = {
        "schema_version": "1.0",
        "status": status,
        "reason": reason,
        "exit_code": exit_code,
        "budget": {"memory_limit_bytes": memory_limit_bytes},
        "peak_observed_rss_bytes": peak_rss_bytes,
        "wall_seconds": wall_seconds,
        "termination_complete": True,
    }
    atomic_write_text(Path(out_dir) / "resource-runtime.json", canonical_json(doc) + "\n")


def prepare_output_dir(directory: Path, overwrite: bool) -> Path:
    """Create ``directory``; refuse a non-empty one unless ``overwrite`` (which deletes only known outputs)."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise InputError("--output-dir", f"{directory} exists and is not a directory")
    if directory.is_dir() and any(directory.iterdir()):
        if not overwrite:
            raise InputError("--output-dir", f"output directory {directory} is not empty; pass --overwrite to replace known aisim outputs")
        for name in KNOWN_OUTPUTS:
            p = directory / name
            if p.is_file():
                p.unlink()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("--output-dir", f"cannot create {directory}: {exc}") from None
    return directory
