"""aisim: predict how an LLM inference deployment behaves before anyone rents the GPUs.

The one public Python facade of the replay::

    import aisim
    report = aisim.run_trace_replay("trace.jsonl", num_workers=2)
    report.summary["mean_ttft_ms"]; report.to_dict()  # == prediction.json

``run_config`` runs a validated predict config, ``plan_from_config`` + ``run_plan`` split that
in two (the plan is plain data). The searches live in ``aisim.search.spica``,
``aisim.search.capacity`` and ``aisim.search.retune``; the command line in ``aisim.cli``. The
repository's folders ``simulator/``, ``actors/``, ``search/`` and ``configs/`` install as
``aisim.simulator``, ``aisim.actors``, ``aisim.search`` and ``aisim.configs`` (setup.py).

The names below load on first use, so ``aisim --help`` does not pay for the simulator's imports.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_FACADE = {
    "run_trace_replay": "aisim.simulator.api",
    "run_synthetic_trace_replay": "aisim.simulator.api",
    "run_config": "aisim.simulator.api",
    "plan_from_config": "aisim.simulator.plan",
    "ReplayPlan": "aisim.simulator.plan",
    "PoolPlan": "aisim.simulator.plan",
    "ExecutionPlan": "aisim.simulator.plan",
    "run_plan": "aisim.simulator.run",
    "ReplayReport": "aisim.simulator.run",
    "load_config": "aisim.simulator.config.loading",
    "InputError": "aisim.simulator.errors",
}

__all__ = ["__version__", "run_trace_replay", "run_synthetic_trace_replay", "run_config", "plan_from_config",
           "ReplayPlan", "PoolPlan", "ExecutionPlan", "run_plan", "ReplayReport", "load_config", "InputError"]
assert set(__all__) == {"__version__", *_FACADE}

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from aisim.simulator.api import run_config, run_synthetic_trace_replay, run_trace_replay
    from aisim.simulator.config.loading import load_config
    from aisim.simulator.errors import InputError
    from aisim.simulator.plan import ExecutionPlan, PoolPlan, ReplayPlan, plan_from_config
    from aisim.simulator.run import ReplayReport, run_plan


def __getattr__(name: str):
    module = _FACADE.get(name)
    if module is None:
        raise AttributeError(f"module 'aisim' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_FACADE))
