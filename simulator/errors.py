"""Errors a user can fix get one line, a clear fix and an exit code (never a traceback)."""

from __future__ import annotations


class AisimError(Exception):
    """Base class; ``exit_code`` is what the CLI returns."""

    exit_code = 1


class InputError(AisimError):
    """Bad config, trace, override or flag (exit code 2). ``where`` names the field or file:line."""

    exit_code = 2

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}" if where else message)


class NotSupportedError(InputError):
    """A valid reference feature this build does not model yet (exit code 2)."""


class ResourceLimitError(AisimError):
    """The run would exceed (or exceeded) its execution.resources limits (exit code 3)."""

    exit_code = 3


class InitTimeoutError(AisimError):
    """Initialisation took longer than execution.resources.initialization_timeout_seconds."""

    exit_code = 124


class RuntimeFailure(AisimError):
    """The actor runtime failed (Ray could not start, an actor died, a call timed out): exit 1."""
