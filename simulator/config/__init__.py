"""Config validation, --set overrides and one-line errors."""

from aisim.simulator.config.paths import get_path, set_path, with_paths

__all__ = ["get_path", "set_path", "with_paths"]
