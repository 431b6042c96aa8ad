"""Errors a user can fix get one line, a clear fix and an exit code (never a traceback).

Every error also carries a ``category`` (one of ``CATEGORIES``), so a caller running many
replays (a search) can classify a failed trial without parsing its message:

- ``kv_capacity``: the KV cache holds no block (weights fill the GPU, capacity too small);
- ``gpu_budget``: the Planner's GPU budget cannot hold what the config asks of it;
- ``context_length``: a bad context length (``engine.context_length``, ``max_model_len``);
- ``unsupported``: a valid reference feature this build does not model yet;
- ``invalid_config``: any other bad config, trace, override or flag;
- ``timeout``: initialisation or an actor call ran out of time;
- ``resource_limit``: the run would exceed its execution.resources limits;
- ``runtime``: the actor runtime failed.

The category never appears in the message, so the CLI prints what it always printed.
"""

from __future__ import annotations

CATEGORIES: tuple[str, ...] = (
    "kv_capacity",
    "gpu_budget",
    "context_length",
    "unsupported",
    "invalid_config",
    "timeout",
    "resource_limit",
    "runtime",
)


def check_category(category: str) -> str:
    """``category`` itself when it is one of ``CATEGORIES``; else ValueError."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown error category {category!r}; use one of {', '.join(CATEGORIES)}")
    return category


class AisimError(Exception):
    """Base class; ``exit_code`` is what the CLI returns, ``category`` what kind of failure it is
    (the class default, or the ``category=`` given when raised)."""

    exit_code = 1
    category = "runtime"

    def __init__(self, *args, category: str | None = None) -> None:
        super().__init__(*args)
        if category is not None:
            self.category = check_category(category)


class InputError(AisimError):
    """Bad config, trace, override or flag (exit code 2). ``where`` names the field or file:line."""

    exit_code = 2
    category = "invalid_config"

    def __init__(self, where: str, message: str, *, category: str | None = None) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message, category=category)

    def __reduce__(self):  # pickles (across processes) with where, message and category intact
        return type(self), (self.where, self.message), self.__dict__


class NotSupportedError(InputError):
    """A valid reference feature this build does not model yet (exit code 2)."""

    category = "unsupported"


class ResourceLimitError(AisimError):
    """The run would exceed (or exceeded) its execution.resources limits (exit code 3)."""

    exit_code = 3
    category = "resource_limit"


class InitTimeoutError(AisimError):
    """Initialisation took longer than execution.resources.initialization_timeout_seconds."""

    exit_code = 124
    category = "timeout"


class RuntimeFailure(AisimError):
    """The actor runtime failed (Ray could not start, an actor died, a call timed out): exit 1."""

    category = "runtime"
