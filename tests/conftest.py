"""Session-wide test environment: nothing may reach the network.

HOME points at a temporary directory holding an empty ``ray_bootstrap_config.yaml`` (Ray skips
its cloud-metadata probes when it exists), Ray usage stats are off and Hugging Face lookups are
offline. Later suites start one session-wide local Ray from here.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

_home = Path(tempfile.mkdtemp(prefix="aisim-test-home-"))
atexit.register(shutil.rmtree, _home, ignore_errors=True)  # (the session's HOME goes with it)
(_home / "ray_bootstrap_config.yaml").write_text("")
os.environ["HOME"] = str(_home)
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("HF_HOME", str(_home / "hf"))

SHARED_TRACES = ROOT.parent / "shared" / "traces"
SLICE = ROOT / "configs" / "data" / "conversation_slice.jsonl"


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the whole session (1 CPU, no dashboard, bound to 127.0.0.1). Runs with
    ``execution.backend: ray`` join it instead of starting their own."""
    import ray

    ray.init(num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             configure_logging=False)
    yield ray
    ray.shutdown()
