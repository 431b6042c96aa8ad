"""Progress on a terminal (rich, on stderr): one component for every command that waits.

Shown only when stderr is a terminal and the command's output is not JSON (``active``); otherwise
every method is a no-op, so a pipe, a log file or ``--format json`` sees nothing of it. Wall-clock
reads happen here, never in the model: the replay reports virtual time and counts
(``simulator.run.run_plan(on_progress=...)``) and this module turns them into speed and ETA.

    with Progress.for_command(args) as progress:
        report = run_plan(plan, on_progress=progress.replay)
"""

from __future__ import annotations

import sys
import time


def _active(args) -> bool:
    if getattr(args, "format", None) == "json":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


NARROW_COLUMNS = 110  # below this the bar is dropped first, then the speed: the count and the ETA stay


class Progress:
    """A live line per task on stderr (see the module doc). ``interval_s``: the least time between
    two redraws (updates in between only record numbers). On a terminal narrower than
    ``NARROW_COLUMNS`` the line has no bar and no speed, so the count and the ETA fit 80 columns."""

    def __init__(self, active: bool, interval_s: float = 0.25, console=None) -> None:
        self.active = active
        self.interval_s = interval_s
        self.console = console  # a rich Console to draw on (None: stderr)
        self._live = None
        self._tasks: dict[str, int] = {}
        self._t0 = time.perf_counter()
        self._last_draw = 0.0
        self.narrow = False
        self._files = self._rows = 0  # a trace being loaded: files and rows read so far
        self._path = None  # (the file being read)

    @classmethod
    def for_command(cls, args) -> "Progress":
        return cls(_active(args))

    def __enter__(self) -> "Progress":
        if self.active:
            from rich.console import Console
            from rich.progress import BarColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            console = self.console or Console(file=sys.stderr, highlight=False)
            self.narrow = console.width < NARROW_COLUMNS
            bar = () if self.narrow else (BarColumn(bar_width=24),)
            self._live = RichProgress(TextColumn("{task.description}"), *bar, TextColumn("{task.fields[detail]}"),
                                      *(() if self.narrow else (TimeElapsedColumn(),)),
                                      console=console, transient=True, auto_refresh=False)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def _update(self, name: str, completed: float, total: float | None, detail: str, force: bool = False) -> None:
        live = self._live
        if live is None:
            return
        task = self._tasks.get(name)
        if task is None:
            task = self._tasks[name] = live.add_task(name, total=total, detail=detail)
        live.update(task, completed=completed, total=total, detail=detail)
        now = time.perf_counter()
        if force or now - self._last_draw >= self.interval_s:
            self._last_draw = now
            live.refresh()

    # -- what commands report ------------------------------------------------------------------
    def log(self, text: str) -> None:
        """A line that stays (printed above the live display)."""
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def replay(self, now_ms: float, end_ms: float | None, ended: int, num_requests: int) -> None:
        """A replay's progress (``run_plan(on_progress=...)``): by virtual time up to the last
        arrival, else by requests ended."""
        if self._live is None:
            return
        t = time.perf_counter()
        if t - self._last_draw < self.interval_s:  # between redraws a call costs one clock read
            return
        wall = t - self._t0
        self._update(*replay_line(now_ms, end_ms, ended, num_requests, wall, self.narrow))

    def loading(self, path, rows: int | None) -> None:
        """A trace being read: ``rows`` more rows of ``path`` read (None: reading starts)."""
        if self._live is None:
            return
        if rows is None:
            self._files = self._rows = 0
            self._path = None
            self._update("loading", 0, None, "the trace...", force=True)
            return
        if path != self._path:
            self._files += 1
            self._path = path
        self._rows += rows
        files = f" in {self._files:,} files" if self._files > 1 else ""
        self._update("loading", self._rows, None, f"the trace: {self._rows:,} rows read{files} (last: "
                                                  f"{getattr(path, 'name', path)})", force=True)

    def steps(self, name: str, done: int, total: int | None, detail: str = "") -> None:
        """Any counted work: trials of a search, points of a sweep, windows of a retune (``total``
        None: not known in advance)."""
        self._update(name, done, total, f"{done:,}{'' if total is None else f' / {total:,}'} {detail}".rstrip(),
                     force=True)


def replay_line(now_ms: float, end_ms: float | None, ended: int, num_requests: int, wall_s: float,
                narrow: bool = False) -> tuple[str, float, float, str]:
    """(task, completed, total, detail) of a replay's progress line. The simulated seconds never
    exceed the span (past the last arrival the replay drains: the line says so); narrow: no speed."""
    sim_s = now_ms / 1000.0
    speed = "" if narrow else (f", {sim_s / wall_s:,.0f}x real time" if wall_s > 0 and sim_s > 0 else "")
    if end_ms:
        frac = min(1.0, now_ms / end_ms)
        eta = f", ETA {wall_s * (1 - frac) / frac:,.0f} s" if 0 < frac < 1 else ""
        span = end_ms / 1000.0
        where = f"{min(sim_s, span):,.0f} / {span:,.0f} simulated s" if now_ms <= end_ms else \
            f"draining after {span:,.0f} simulated s"
        return "replay", frac, 1.0, f"{where}, {ended:,} / {num_requests:,} requests{eta}{speed}"
    return "replay", ended, max(num_requests, 1), f"{ended:,} / {num_requests:,} requests, {sim_s:,.0f} simulated s{speed}"
