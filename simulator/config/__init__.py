"""Config validation, --set overrides and one-line errors."""

from simulator.config.paths import get_path, set_path, with_paths

__all__ = ["get_path", "set_path", "with_paths"]
