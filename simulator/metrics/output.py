"""Writing results: canonical JSON, atomic files, the output directory contract.

The output directory is written as one transaction (``OutputTransaction``):

- ``open()`` locks the directory, clears leftovers of interrupted runs, checks the directory can be
  written and creates an empty staging directory next to it, ``.<name>.aisim-tmp-<pid>`` (same
  parent, so the same filesystem), all before the run starts;
- the run writes every file into the staging directory;
- ``commit()`` puts the staging directory in place in one step: ``rename`` when the directory does
  not exist yet; an atomic exchange (Linux ``renameat2(RENAME_EXCHANGE)``) of the two directories
  when it does, after which the old one is deleted. Where the exchange is not available the old
  directory is renamed aside (``.<name>.aisim-old-<pid>``) and the new one renamed in; a run killed
  between those two renames is rolled back by the next run into the same directory;
- ``close()`` without a commit deletes the staging directory (and any parent directories
  ``open()`` created), so an interrupted or failed run leaves the previous outputs as they were.

``--overwrite`` keeps its contract: the new run's files replace aisim's own files
(``KNOWN_OUTPUTS``); any other file or folder in the directory stays. Those are carried into the new
directory as hard links (same inodes, nothing copied; a file that cannot be hard-linked, e.g. across
a mount, is copied), and the new directory gets the old one's permission bits. Because the directory
itself is replaced, it may not be a mount point, the working directory or one of its parents.

The lock is an exclusive ``flock`` on ``.<name>.aisim-lock`` in the parent directory, holding the
owner's pid. The kernel releases it when the process exits in any way (even SIGKILL), so a stale
lock file never blocks; a clean exit deletes the file. While a run holds the lock, every
``.<name>.aisim-tmp-*`` / ``.<name>.aisim-old-*`` sibling of a dead process is a leftover of an
interrupted run, and is deleted (or, for the one case above, restored).
"""

from __future__ import annotations

import csv
import ctypes
import errno
import fcntl
import hashlib
import io
import itertools
import json
import math
import os
import re
import secrets
import shutil
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from aisim.simulator.errors import InputError

#: every file aisim writes into an output directory (``--overwrite`` replaces only these)
KNOWN_OUTPUTS = ("prediction.json", "requests.jsonl", "worker_timeline.csv", "request_metrics.csv", "report.html",
                 "resource-plan.json", "resource-runtime.json", "planner_events.csv", "planner_replicas.csv")

#: temporary files of earlier aisim versions, which wrote in place (``.prediction.json.<random>.tmp``)
_LEGACY_TMP = re.compile(r"\.(?:%s)\..+\.tmp" % "|".join(re.escape(n) for n in KNOWN_OUTPUTS))


def _clean(x):
    """NaN/inf -> null so the JSON is standard; recurse into containers."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def canonical_json(obj, indent: int | None = 2, ensure_ascii: bool = False) -> str:
    return json.dumps(_clean(obj), sort_keys=True, indent=indent, allow_nan=False, ensure_ascii=ensure_ascii)


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new ``.<name>.<random>.tmp`` next to ``path``, created with mode 0666 less the umask (as
    ``open()`` creates files; ``tempfile.mkstemp`` would make it 0600)."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue


def discard(path) -> None:
    """Remove a temporary file, if it is still there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def write_temp(path: Path, chunks: Iterable[str]) -> Path:
    """``chunks`` written and fsynced to a new temporary sibling of ``path`` (mode 0666 less the
    umask); the caller renames it into place (or several together). Nothing is left on failure."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for chunk in chunks:
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        discard(tmp)
        raise
    return tmp


def atomic_write_chunks(path: Path, chunks: Iterable[str]) -> None:
    """Write ``chunks`` to a temporary file in the same directory, fsync, then rename over ``path``."""
    tmp = write_temp(path, chunks)
    try:
        os.replace(tmp, path)
    except BaseException:
        discard(tmp)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write to a temporary file in the same directory, fsync, then rename over ``path``."""
    atomic_write_chunks(path, (text,))


def atomic_write_lines(path: Path, rows) -> None:
    """One canonical JSON object per line, serialised row by row (never the whole file in memory)."""
    atomic_write_chunks(path, (canonical_json(r, indent=None) + "\n" for r in rows))


_CSV_BATCH_ROWS = 1024
_CSV_QUOTED = re.compile(r'[,"\x00-\x1f]')  # (a string with any of these: the csv module formats its batch)
_CELL_KINDS = frozenset((float, int, str))


def csv_lines(header: Iterable, rows: Iterable[Iterable]) -> Iterable[str]:
    """``header`` then every row as CSV text (the ``csv`` module's quoting, ``\\n`` line ends), in
    chunks of up to ``_CSV_BATCH_ROWS`` lines: the rows are formatted as they are consumed, never
    all collected. A batch of plain cells is formatted by columns (``_csv_columns``), the same text."""
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(header)
    head = buf.getvalue()
    it = iter(rows)
    size = max(1, _CSV_BATCH_ROWS - 1)  # (the header's chunk: as many lines as the others)
    while True:
        batch = list(itertools.islice(it, size))
        size = _CSV_BATCH_ROWS
        if not batch:
            if head:
                yield head
            return
        text = _csv_columns(batch)
        if text is None:
            buf.seek(0)
            buf.truncate()
            out.writerows(batch)
            text = buf.getvalue()
        if head:
            text = head + text
            head = ""
        yield text


def _csv_columns(batch: list) -> str | None:
    """The ``csv`` module's text for ``batch`` when every row has the same two or more cells and
    each column holds str, int and float cells only (a column of numbers may hold "" for a missing
    value; no string needs quoting), else None. Numbers are formatted a column at a time by orjson,
    whose floats are the shortest round-trip digits, as ``repr``'s; the forms where the two spell
    them differently (an exponent, a leading 0.0000, NaN and infinities) are taken from ``str``,
    which is what the csv module writes."""
    n = len(batch[0])
    if n < 2 or len(set(map(len, batch))) != 1:
        return None
    import orjson

    cols = []
    for col in zip(*batch):
        kinds = set(map(type, col))
        if kinds == {str}:
            if _CSV_QUOTED.search("".join(col)):
                return None
            cols.append(col)
            continue
        if not kinds <= _CELL_KINDS:
            return None
        try:
            text = orjson.dumps(col).decode()
        except TypeError:  # (an int beyond 64 bits)
            return None
        if str in kinds:
            text = text.replace('""', "")
            if '"' in text:  # (a string other than "" among numbers)
                return None
        cells = text[1:-1].split(",")
        if float in kinds and ("e" in text or "0.0000" in text or "null" in text):
            cells = [str(x) if "e" in c or "0.0000" in c or c == "null" else c for c, x in zip(cells, col)]
        cols.append(cells)
    return "\n".join(map(",".join, zip(*cols))) + "\n"


def atomic_write_csv(path: Path, header: Iterable, rows: Iterable[Iterable]) -> None:
    """A CSV file written row by row (``csv_lines``) to a temporary sibling, fsynced, then renamed
    over ``path``."""
    atomic_write_chunks(Path(path), csv_lines(header, rows))


def write_resource_runtime(out_dir: Path, status: str, reason: str | None, exit_code: int,
                           memory_limit_bytes: int | None, peak_rss_bytes: int, wall_seconds: float) -> None:
    """``resource-runtime.json``: how the run ended (``status`` completed, failed or resource_limited;
    ``exit_code`` the command's exit status) against its execution.resources budget."""
    doc = {
        "schema_version": "1.0",
        "status": status,
        "reason": reason,
        "exit_code": exit_code,
        "budget": {"memory_limit_bytes": memory_limit_bytes},
        "peak_observed_rss_bytes": peak_rss_bytes,
        "wall_seconds": wall_seconds,
        "termination_complete": True,
    }
    atomic_write_text(Path(out_dir) / "resource-runtime.json", canonical_json(doc) + "\n")


# --- the output directory as a transaction ------------------------------------------------------

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def _renameat2():
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or filesystem cannot, OSError on any other failure."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(str(a)), _AT_FDCWD, os.fsencode(str(b)), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, getattr(errno, "ENOTSUP", errno.EOPNOTSUPP)):
        return False
    raise OSError(err, os.strerror(err), str(b))


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def fsync_dir(path) -> None:
    """fsync a directory (its entries' renames), best effort."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _link_tree(src: Path, dst: Path) -> None:
    """Recreate ``src`` at ``dst`` without copying data: directories are made anew, everything else
    is hard-linked (a regular file or symlink that cannot be linked is copied)."""
    st = os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst)
        with os.scandir(src) as it:
            for entry in it:
                _link_tree(Path(entry.path), dst / entry.name)
        shutil.copystat(src, dst, follow_symlinks=False)
        return
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src), dst)
        elif stat.S_ISREG(st.st_mode):
            shutil.copy2(src, dst)
        else:
            raise


def _is_aisim_file(name: str) -> bool:
    return name in KNOWN_OUTPUTS or _LEGACY_TMP.fullmatch(name) is not None


def _sibling_stem(target: Path) -> str:
    """The name a directory's siblings (lock, staging) are made from (within NAME_MAX)."""
    name = target.name
    return name if len(os.fsencode(name)) <= 200 else hashlib.sha256(os.fsencode(name)).hexdigest()[:32]


def lock_output_dir(directory: Path) -> "ProcessLock":
    """Lock an output directory as a predict run does (the same lock file, so a predict, a recommend
    and a capacity search never write one directory at once); InputError naming the owner when
    another process holds it. The caller releases it (``release()``); the directory is created."""
    requested = Path(directory)
    try:
        requested.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError("--output-dir", f"cannot create output directory {requested}: {exc.strerror}") from None
    target = Path(os.path.realpath(requested))
    lock = ProcessLock(target.parent / f".{_sibling_stem(target)}.aisim-lock")
    try:
        owner = lock.acquire()
    except OSError as exc:
        raise InputError("--output-dir", f"cannot lock output directory {requested}: {exc.strerror}") from None
    if owner is not None:
        raise _in_use(requested, owner)
    return lock


def _in_use(requested: Path, owner: int) -> InputError:
    who = f"pid {owner}" if owner else "pid unknown"
    return InputError("--output-dir", f"{requested} is in use by another aisim process ({who}); wait for it to "
                                      "finish or choose another directory")


class ProcessLock:
    """An exclusive ``flock`` on a file that holds the owner's pid. The kernel releases it when the
    process exits in any way (even SIGKILL), so a stale lock file never blocks; ``release()`` deletes
    the file. ``acquire()`` returns None when locked, else the owner's pid (0 when unknown); a
    filesystem without locks is taken as unlocked. Used for output directories and study claims."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self) -> int | None:
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                owner = self._read_owner(fd)
                os.close(fd)
                return owner or 0
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    return None  # this filesystem has no locks: go on unlocked
                raise
            try:
                same = os.stat(self.path)
                mine = os.fstat(fd)
            except FileNotFoundError:
                same = mine = None
            if same is None or (same.st_dev, same.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)  # the previous owner deleted the file as we locked it: lock the new one
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            self._fd = fd
            return None

    @staticmethod
    def _read_owner(fd: int) -> int | None:
        for _ in range(20):  # the owner writes its pid right after taking the lock
            try:
                text = os.pread(fd, 32, 0).decode(errors="replace").strip()
            except OSError:
                return None
            if text.isdigit():
                return int(text)
            time.sleep(0.025)
        return None

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.unlink(self.path)  # safe: whoever locks next checks it locked the file at this path
        except OSError:
            pass
        finally:
            os.close(fd)


class OutputTransaction:
    """One run's output directory: ``open()`` before the run, write into ``staging``, ``commit()``
    when complete, ``close()`` always (see the module docstring)."""

    def __init__(self, directory: Path, overwrite: bool) -> None:
        self.requested = Path(directory)
        self.overwrite = overwrite
        self.target = Path(os.path.realpath(self.requested))  # a symlinked directory is replaced where it lives
        self.parent = self.target.parent
        self._stem = _sibling_stem(self.target)
        self.staging: Path | None = None
        self.committed = False
        self._lock_obj: ProcessLock | None = None
        self._lock_path = self.parent / f".{self._stem}.aisim-lock"
        self._created: list[Path] = []  # parent directories open() made, deepest last

    # -- public -------------------------------------------------------------------------------

    def open(self) -> "OutputTransaction":
        try:
            self._check_placement()
            self._make_parents()
            self._lock()
            self._recover()
            self._check_target()
            self._stage()
        except BaseException:
            self.close()
            raise
        return self

    @property
    def has_previous_outputs(self) -> bool:
        """Whether the target already holds aisim outputs (a failed run must leave them alone)."""
        try:
            with os.scandir(self.target) as it:
                return any(_is_aisim_file(entry.name) for entry in it)
        except OSError:
            return False

    def commit(self) -> None:
        """Put the staging directory in place (one rename or one exchange)."""
        staging, target = self.staging, self.target
        assert staging is not None and not self.committed
        fsync_dir(staging)
        if not os.path.lexists(target):
            os.rename(staging, target)
        else:
            with os.scandir(target) as it:
                carried = [entry.name for entry in it if not _is_aisim_file(entry.name)]
            for name in carried:
                if not os.path.lexists(staging / name):
                    _link_tree(target / name, staging / name)
            st = os.stat(target)
            os.chmod(staging, stat.S_IMODE(st.st_mode))  # the directory keeps its permissions ...
            if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
                try:
                    os.chown(staging, st.st_uid, st.st_gid)  # ... and, where we may, its owner
                except OSError:
                    pass
            if exchange_paths(staging, target):
                old = staging  # the staging name now holds the previous directory
            else:
                old = self.parent / f".{self._stem}.aisim-old-{os.getpid()}"
                os.rename(target, old)
                try:
                    os.rename(staging, target)  # killed before this line: the next run renames `old` back
                except BaseException:
                    os.rename(old, target)
                    raise
            self.committed = True
            shutil.rmtree(old, ignore_errors=True)
        self.committed = True
        self.staging = None
        fsync_dir(self.parent)

    def close(self) -> None:
        """Without a commit: delete the staging directory and the parents open() made. Release the lock."""
        if not self.committed and self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
            self.staging = None
        self._unlock()
        if not self.committed:
            for d in reversed(self._created):
                try:
                    os.rmdir(d)
                except OSError:
                    break
            self._created = []

    def __enter__(self) -> "OutputTransaction":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- steps ----------------------------------------------------------------------------------

    def _error(self, message: str) -> InputError:
        return InputError("--output-dir", message)

    def _check_placement(self) -> None:
        target = self.target
        if target == self.parent:
            raise self._error(f"{self.requested} is the filesystem root; choose a directory below it")
        if os.path.lexists(target) and not os.path.isdir(target):
            raise self._error(f"{self.requested} exists and is not a directory")
        cwd = Path(os.path.realpath(os.getcwd()))
        if cwd == target or target in cwd.parents:
            raise self._error(f"{self.requested} is the working directory or one of its parents; aisim replaces "
                              "the output directory as a whole when the run completes, so choose a subdirectory")
        if os.path.isdir(target) and os.path.ismount(target):
            raise self._error(f"{self.requested} is a mount point; aisim replaces the output directory as a whole "
                              "when the run completes, so choose a subdirectory of it")

    def _make_parents(self) -> None:
        missing = []
        p = self.parent
        while not os.path.isdir(p):
            if os.path.lexists(p):
                raise self._error(f"cannot create {self.requested}: {p} is not a directory")
            missing.append(p)
            if p.parent == p:
                break
            p = p.parent
        for d in reversed(missing):
            try:
                os.mkdir(d)
            except FileExistsError:
                continue
            except OSError as exc:
                raise self._error(f"cannot create {self.requested}: {exc.strerror}: {d}") from None
            self._created.append(d)

    def _not_writable(self, where: Path, exc: OSError | None = None) -> InputError:
        why = exc.strerror if exc is not None and exc.strerror else "permission denied"
        return self._error(f"cannot write to output directory {self.requested}: {why}: {where}")

    def _lock(self) -> None:
        if not os.access(self.parent, os.W_OK | os.X_OK):
            raise self._not_writable(self.parent)
        lock = ProcessLock(self._lock_path)
        try:
            owner = lock.acquire()
        except OSError as exc:
            raise self._not_writable(self.parent, exc) from None
        if owner is not None:
            raise _in_use(self.requested, owner)
        self._lock_obj = lock

    def _unlock(self) -> None:
        lock, self._lock_obj = self._lock_obj, None
        if lock is not None:
            lock.release()

    def _leftovers(self) -> tuple[list[Path], list[Path]]:
        pattern = re.compile(r"\.%s\.aisim-(tmp|old)-(\d+)" % re.escape(self._stem))
        tmp, old = [], []
        try:
            with os.scandir(self.parent) as it:
                for entry in it:
                    m = pattern.fullmatch(entry.name)
                    if m and (int(m[2]) == os.getpid() or not pid_alive(int(m[2]))):
                        (tmp if m[1] == "tmp" else old).append(Path(entry.path))
        except OSError:
            pass
        return tmp, old

    def _recover(self) -> None:
        """Under the lock: roll back an interrupted two-rename swap, delete interrupted runs' staging."""
        tmp, old = self._leftovers()
        if old and not os.path.lexists(self.target):
            newest = max(old, key=lambda p: os.lstat(p).st_mtime)
            os.rename(newest, self.target)
            old.remove(newest)
        for p in tmp + old:
            shutil.rmtree(p, ignore_errors=True)

    def _check_target(self) -> None:
        target = self.target
        if not os.path.lexists(target):
            return
        if not os.path.isdir(target):
            raise self._error(f"{self.requested} exists and is not a directory")
        try:
            with os.scandir(target) as it:
                names = [entry.name for entry in it]
        except OSError as exc:
            raise self._error(f"cannot read output directory {self.requested}: {exc.strerror}") from None
        if not os.access(target, os.W_OK | os.X_OK):
            raise self._not_writable(target)
        leftovers_only = all(_LEGACY_TMP.fullmatch(n) for n in names)  # an old version's interrupted write
        if names and not leftovers_only and not self.overwrite:
            raise self._error(f"output directory {self.requested} is not empty; pass --overwrite to replace "
                              "known aisim outputs")
        for name in names:  # other files are carried into the new directory: check now that they can be
            if not _is_aisim_file(name) and os.path.isdir(target / name) and not os.path.islink(target / name):
                for d, _, _ in os.walk(target / name, onerror=self._unreadable):
                    if not os.access(d, os.R_OK | os.X_OK):
                        self._unreadable(PermissionError(errno.EACCES, "Permission denied", d))

    def _unreadable(self, exc: OSError) -> None:
        raise self._error(f"cannot carry {exc.filename} over into the new {self.requested} (--overwrite keeps "
                          f"files that are not aisim's): {exc.strerror}") from None

    def _stage(self) -> None:
        staging = self.parent / f".{self._stem}.aisim-tmp-{os.getpid()}"
        try:
            os.mkdir(staging, 0o777)  # mode from the umask, as mkdir(1)
        except OSError as exc:
            raise self._not_writable(self.parent, exc) from None
        self.staging = staging
