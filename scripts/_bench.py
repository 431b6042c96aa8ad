"""What every benchmark script sets up first: a HOME that keeps Ray and Hugging Face offline."""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from pathlib import Path


def offline_home(environ=os.environ) -> Path:
    """A fresh HOME holding an empty ``ray_bootstrap_config.yaml`` (Ray skips cloud-metadata probes),
    with Ray usage stats and Hugging Face lookups off, set in ``environ`` (this process's by default)."""
    home = Path(tempfile.mkdtemp(prefix="aisim-bench-home-"))
    (home / "ray_bootstrap_config.yaml").write_text("")
    environ.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    return home


def bench_meta(repeats: int) -> dict:
    """The machine, the date and the repeat count a benchmark's result is stated with."""
    return {"machine": f"{platform.node()} ({platform.processor() or platform.machine()}), "
                       f"Python {platform.python_version()}",
            "date": time.strftime("%Y-%m-%d"), "repeats": repeats}


def print_head(meta: dict, rows: list, as_json: bool) -> bool:
    """``--json``: the result as one JSON document (True: nothing more to print); else the line
    that states the machine, the date and the repeats above the table (False)."""
    if as_json:
        print(json.dumps({"meta": meta, "rows": rows}, indent=2))
        return True
    print(f"{meta['machine']}, {meta['date']}, median of {meta['repeats']}")
    return False
