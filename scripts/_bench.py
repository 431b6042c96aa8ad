"""What every benchmark script sets up first: a HOME that keeps Ray and Hugging Face offline."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def offline_home(environ=os.environ) -> Path:
    """A fresh HOME holding an empty ``ray_bootstrap_config.yaml`` (Ray skips cloud-metadata probes),
    with Ray usage stats and Hugging Face lookups off, set in ``environ`` (this process's by default)."""
    home = Path(tempfile.mkdtemp(prefix="aisim-bench-home-"))
    (home / "ray_bootstrap_config.yaml").write_text("")
    environ.update(HOME=str(home), RAY_USAGE_STATS_ENABLED="0", HF_HUB_OFFLINE="1")
    return home
