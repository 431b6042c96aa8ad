"""Trial results by key, for every search: one ``TrialCache`` type.

A key is a string: Spica and retune key a candidate by its canonical point (``asktell.point_key``),
capacity search a trial by ``config_key`` (a digest of its resolved predict config and the aisim
version). A cache always holds its entries in memory (a search's own dedupe: a point asked twice
is evaluated once); given a directory it also keeps them on disk, one JSON file per key, so a
rerun into any output directory reuses them (capacity search, ``~/.cache/aisim``). Disk entries
are written atomically; one that cannot be read (damaged, or from an older format) is a miss,
and one that cannot be written only costs the next run the replay.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["TrialCache", "config_key"]

_FORMAT = 1  # bumped when an entry's layout changes (older entries then read as misses)


def config_key(mapping: Any, **extra: Any) -> str:
    """sha256 of the canonical JSON of ``mapping`` (a resolved config), the aisim version and ``extra``."""
    from aisim import __version__

    doc = json.dumps({"config": mapping, "aisim": __version__, **extra}, sort_keys=True, default=str)
    return hashlib.sha256(doc.encode()).hexdigest()


class TrialCache:
    """Key -> result (any value in memory; JSON-able values on disk)."""

    def __init__(self, directory: Path | str | None = None) -> None:
        self.directory = Path(directory) if directory is not None else None
        self._memory: dict[str, Any] = {}

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str, default: Any = None) -> Any:
        if key in self._memory:
            return self._memory[key]
        if self.directory is None:
            return default
        try:
            doc = json.loads(self._path(key).read_text())
        except (OSError, ValueError):
            return default
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT or "result" not in doc:
            return default
        self._memory[key] = doc["result"]
        return doc["result"]

    def put(self, key: str, result: Any) -> None:
        self._memory[key] = result
        if self.directory is None:
            return
        from aisim.simulator.metrics.output import atomic_write_text

        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            # allow_nan: a result's rows may hold inf (a request that never completed)
            atomic_write_text(self._path(key), json.dumps({"format": _FORMAT, "result": result}, allow_nan=True))
        except OSError:
            pass

    def __getitem__(self, key: str) -> Any:
        missing = object()
        value = self.get(key, missing)
        if value is missing:
            raise KeyError(key)
        return value

    def __setitem__(self, key: str, result: Any) -> None:
        self.put(key, result)

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, str):
            return False
        missing = object()
        return self.get(key, missing) is not missing

    def __len__(self) -> int:
        """The entries held in memory (asked or read in this process)."""
        return len(self._memory)

    def __iter__(self) -> Iterator[str]:
        return iter(self._memory)

    def values(self):
        return self._memory.values()
