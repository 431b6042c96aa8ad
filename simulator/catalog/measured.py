"""``timing.type: default``: measured kernel data through aiconfigurator-core, as tables.

aiconfigurator-core predicts a forward pass from measured (silicon) kernel tables of a
model x GPU x backend x version x parallelism. A call costs 3-40 us, too slow for the
hundreds of thousands of passes of a replay, so we sample it once on grids and interpolate:

- ``shared(T)``: non-attention ops (GEMMs, norms, communication) for T tokens in the pass;
  every integer T up to 512, then steps of 8 up to 4096, of 64 up to 32,768;
- ``decode_attention(b, L)``: decode attention for b sequences of mean length L; b every
  integer up to 64, steps of 8 up to 512, of 64 up to 1024; L on a sqrt(2) grid up to 262,144;
- ``prefill_attention(n, new, prefix)``: context attention for n requests each computing
  ``new`` tokens over ``prefix`` cached ones; n in powers of two up to 1024, new on a sqrt(2)
  grid up to 32,768, prefix 0 and powers of two up to 262,144.

Beyond a grid, the last segment extrapolates linearly. The tables are cached on disk
(``$AISIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/aisim``, else ``~/.cache/aisim``) under a key of
the package version, the requested backend version (or alias), the model's config, GPU, backend
and parallelism; the file also records the data version the request resolved to. So only the
first run of a configuration pays the few seconds to build them, and a disk hit needs no call into
aiconfigurator-core at all (resolving versions alone costs it ~0.3-1.3 s). Within a process the
result is memoised: a repeated lookup returns the same (read-only) model in microseconds.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from aisim.actors.engine.timing import MeasuredTables, MeasuredTiming
from aisim.simulator.catalog.models import ModelSource, check_tensor_split
from aisim.simulator.errors import InputError, NotSupportedError

GRID_VERSION = 1
_NPZ_FIELDS = ("tokens", "shared_ms", "batch", "seq_len", "decode_attn_ms", "prefill_n", "prefill_new",
               "prefill_prefix", "prefill_attn_ms")
_SLOT_ALIASES = ("current", "previous", "next")

# request key -> the model built or loaded for it; a MeasuredTiming holds no per-run state and its
# tables are made read-only, so every caller in the process can share one instance
_MEMO: dict[str, MeasuredTiming] = {}


def _tokens_grid() -> np.ndarray:
    return np.unique(np.concatenate([np.arange(1, 513), np.arange(520, 4097, 8), np.arange(4160, 32769, 64)]))


def _batch_grid() -> np.ndarray:
    return np.unique(np.concatenate([np.arange(1, 65), np.arange(72, 513, 8), np.arange(576, 1025, 64)]))


def _sqrt2_grid(lo: int, hi: int) -> np.ndarray:
    n = int(math.ceil(2 * math.log2(hi / lo)))
    return np.unique(np.round(lo * np.sqrt(2.0) ** np.arange(n + 1)).astype(np.int64))


def _seq_grid() -> np.ndarray:
    return np.unique(np.concatenate([[1, 2, 4, 8], _sqrt2_grid(16, 262_144)]))


def _prefill_grids() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n = 2 ** np.arange(11)  # 1 .. 1024
    new = np.unique(np.concatenate([[1, 2, 4, 8], _sqrt2_grid(16, 32_768)]))
    prefix = np.concatenate([[0], 2 ** np.arange(4, 19)])  # 0, 16 .. 262,144
    return n, new, prefix


def cache_dir() -> Path:
    env = os.environ.get("AISIM_CACHE_DIR")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "aisim"


@functools.cache
def _aic_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        return ""


def measured_timing(
    src: ModelSource,
    hardware: str,
    backend: str,
    backend_version: str | None,
    *,
    tensor: int = 1,
    pipeline: int = 1,
    attention_data: int = 1,
    moe_tensor: int = 1,
    moe_expert: int = 1,
    field: str = "timing.type",
) -> MeasuredTiming:
    pkg = _aic_version()
    if not pkg:
        raise InputError(field, "timing.type default needs the aiconfigurator-core package (pip install -e . installs it); "
                                "or set timing.type: roofline")
    # aiconfigurator asserts this deep inside (an AssertionError that read as "no data: use roofline")
    check_tensor_split(src, tensor, tensor_field(field))
    alias = backend_version or "current"
    parallel = [tensor, pipeline, attention_data, moe_tensor, moe_expert]
    key = _request_key(pkg, src, hardware, backend, alias, parallel)
    hit = _MEMO.get(key)
    if hit is not None:
        return hit
    path = cache_dir() / "measured-timing" / f"{key}.npz"
    loaded = _load(path)
    if loaded is not None:
        tables, data_version = loaded
    else:
        what = (f"{src.model_id} on {hardware} with {backend} {alias} (tensor {tensor}, pipeline {pipeline}, "
                f"attention_data {attention_data}, moe_tensor {moe_tensor}, moe_expert {moe_expert})")
        data_version = _resolve_data_version(hardware, backend, alias, field, what)
        tables = _build(src, hardware, backend, alias, what, field, tensor, pipeline, attention_data, moe_tensor, moe_expert)
        _save(path, tables, data_version)
    for name in _NPZ_FIELDS:
        getattr(tables, name).setflags(write=False)  # shared by every user of the memoised model
    model = MeasuredTiming(tables, f"aiconfigurator-core {pkg}: measured kernel tables, interpolated",
                           f"{hardware}/{backend}/{data_version}")
    _MEMO[key] = model
    return model


def tensor_field(field: str) -> str:
    """The tensor-parallelism key next to a timing ``field``: ``engine.workers.<role>.timing`` ->
    ``engine.workers.<role>.parallelism.tensor``; else the engine argument's name."""
    if field.endswith(".timing"):
        return field.removesuffix(".timing") + ".parallelism.tensor"
    return "tensor_parallel_size"


def _request_key(pkg: str, src: ModelSource, hardware: str, backend: str, alias: str, parallel: list[int]) -> str:
    """Disk-cache (and memo) key of a request, computed without calling aiconfigurator-core."""
    doc = {
        "grid": GRID_VERSION, "aiconfigurator_core": pkg, "systems": _systems_paths_override(), "hardware": hardware,
        "backend": backend, "version": alias, "config": src.config, "quant": src.quant_config, "parallel": parallel,
    }
    if alias not in _SLOT_ALIASES:  # a raw version resolves differently with aiconfigurator's escape hatch on
        doc["allow_unlisted"] = os.environ.get("AIC_ALLOW_UNLISTED_VERSIONS", "").lower() in ("1", "true", "yes")
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32]


def _systems_paths_override() -> list[str] | None:
    """aiconfigurator's data directories when a caller overrode them in this process (set_systems_paths),
    else None (the package's own data, already covered by its version). Only looked up when the module
    is already loaded: nobody can have overridden them otherwise."""
    pdb = sys.modules.get("aiconfigurator_core.sdk.perf_database")
    if pdb is None:
        return None
    try:
        paths = [str(p) for p in pdb.get_systems_paths()]
        return None if paths == [_default_systems_path()] else paths
    except Exception:  # noqa: BLE001 - an older/newer library layout: key on nothing extra
        return None


@functools.cache
def _default_systems_path() -> str:
    from importlib.resources import files

    return os.fspath(files("aiconfigurator_core") / "systems")


def _resolve_data_version(hardware: str, backend: str, alias: str, field: str, what: str) -> str:
    """The data version ``alias`` means for (hardware, backend). Systems with version slots (all the
    shipped data) resolve directly; enumerating every database (~1 s) happens only otherwise, or to
    explain a failure (which versions have data)."""
    try:
        from aiconfigurator_core.sdk.perf_database import get_supported_databases, get_version_slots, resolve_query_version
    except Exception as exc:  # noqa: BLE001 - a broken install
        raise _unsupported(field, what, exc) from None
    try:
        if get_version_slots(hardware, backend) is not None:
            return str(resolve_query_version(hardware, backend, alias))
    except Exception:  # noqa: BLE001 - an unknown version or alias: the full listing below explains it
        pass
    try:
        versions = list(get_supported_databases().get(hardware, {}).get(backend, []))
    except Exception as exc:  # noqa: BLE001 - the data catalogue itself is unreadable
        raise _unsupported(field, what, exc) from None
    if not versions:
        raise NotSupportedError(field, f"no measured timing data for {backend} on {hardware}; "
                                       "use timing.type: roofline (or polynomial)")
    try:
        return str(resolve_query_version(hardware, backend, alias))
    except Exception:  # noqa: BLE001 - an unknown version or alias
        raise InputError("engine.backend_version", f"no measured data for {backend} {alias!r} on {hardware}; "
                                                   f"use current, next or one of {', '.join(versions)}") from None


def _unsupported(field: str, what: str, exc: Exception) -> NotSupportedError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(reason) > 300:
        reason = reason[:297] + "..."
    return NotSupportedError(field, f"no measured timing data for {what}: {type(exc).__name__}: {reason}; "
                                    "use timing.type: roofline (or polynomial)")


def _load(path: Path) -> tuple[MeasuredTables, str] | None:
    """The cached tables and the data version they were built from, or None (absent or unreadable)."""
    try:
        with np.load(path) as z:
            return MeasuredTables(**{k: z[k] for k in _NPZ_FIELDS}), str(z["data_version"])
    except (OSError, KeyError, ValueError, EOFError):
        return None


def _save(path: Path, tables: MeasuredTables, data_version: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".measured-", suffix=".npz", dir=path.parent)
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, data_version=np.array(data_version), **{k: getattr(tables, k) for k in _NPZ_FIELDS})
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache only costs a rebuild next time


def _build(src: ModelSource, hardware, backend, alias, what, field, tensor, pipeline, attention_data,
           moe_tensor, moe_expert) -> MeasuredTables:
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    try:
        from aiconfigurator_core.sdk.engine import EngineHandle

        with tempfile.TemporaryDirectory(prefix="aisim-model-") as d:
            # always hand aiconfigurator a local directory: it never goes to the network for one
            (Path(d) / "config.json").write_text(json.dumps(src.config))
            if src.quant_config is not None:
                (Path(d) / "hf_quant_config.json").write_text(json.dumps(src.quant_config))
            eng = EngineHandle.compile(d, hardware, backend, backend_version=alias, tp_size=tensor, pp_size=pipeline,
                                       attention_dp_size=attention_data, moe_tp_size=moe_tensor, moe_ep_size=moe_expert)
        bd = eng.mixed_step_breakdown
        tokens = _tokens_grid()
        shared = np.array([bd(int(t), 0, int(t), 1, 0)[1] for t in tokens])
        batch = _batch_grid()
        seq = _seq_grid()
        dec = np.array([[bd(0, int(b), max(1, int(s) - 1), 1, 0)[3] for s in seq] for b in batch])
        pn, pnew, ppre = _prefill_grids()
        patt = np.array([[[bd(int(n * (p + w)), 0, int(p + w), 1, int(p))[2] for p in ppre] for w in pnew] for n in pn])
    except Exception as exc:  # noqa: BLE001 - the library raises many kinds; all mean "no data for this"
        raise _unsupported(field, what, exc) from None
    for name, arr in (("shared", shared), ("decode", dec), ("prefill", patt)):
        if not np.all(np.isfinite(arr)) or (arr < 0).any():
            raise NotSupportedError(field, f"measured timing for {what} gave invalid {name} latencies; use timing.type: roofline")
    return MeasuredTables(tokens, shared, batch, seq, dec, pn, pnew, ppre, patt)
