"""Trees to compare, each installed the way a user gets it (shared by compare_commits.py and the
benchmarks' ``--compare``).

``installed(rev)`` checks ``rev`` out (``WORKTREE``: a copy of this checkout's tracked and
untracked, not ignored, files), builds its wheel offline (``pip wheel --no-deps
--no-build-isolation``) and unpacks it into a fresh virtual environment that borrows this
environment's dependencies through a ``.pth`` file; it yields ``(tree, python)``. The two sides of
a comparison then never share a module, whatever their package layout (before and after the move
to the one ``aisim`` namespace), and neither sees this checkout's editable install.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tempfile
import venv
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKTREE = "WORKTREE"


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def is_commit(rev: str) -> bool:
    return rev == WORKTREE or subprocess.run(["git", "rev-parse", "--verify", "-q", rev + "^{commit}"], cwd=ROOT,
                                             capture_output=True).returncode == 0


def checkout(rev: str, into: Path) -> Path:
    """The tree of ``rev`` (or of the working tree) at ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    if rev == WORKTREE:
        for name in filter(None, _git("ls-files", "-co", "--exclude-standard", "-z").split("\0")):
            src = ROOT / name
            if src.is_file():
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, into / name)
        return into
    archive = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _borrowed_site_packages() -> list[str]:
    paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    return sorted(p for p in paths if Path(p).is_dir())


def build_wheel(tree: Path, dist: Path, env: dict | None = None) -> Path:
    """The wheel of ``tree`` (offline: no build isolation, no dependencies), built into ``dist``."""
    b = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(dist), str(tree)], capture_output=True, text=True, env=env, timeout=600)
    if b.returncode != 0:
        raise SystemExit(f"building the wheel of {tree} failed:\n{b.stderr[-2000:]}")
    (wheel,) = dist.glob("aisim-*.whl")
    return wheel


def install_wheel(wheel: Path, env_dir: Path) -> tuple[str, str]:
    """A fresh venv at ``env_dir`` with ``wheel`` unpacked as pip would (a wheel is a zip of the
    installed files) and this environment's dependencies borrowed; ``(its python, its site-packages)``."""
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = str(env_dir / "bin" / "python")
    site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    Path(site, "zz_borrowed_deps.pth").write_text("\n".join(_borrowed_site_packages()) + "\n")
    return py, site


def environment(tree: Path, where: Path) -> str:
    """A fresh venv holding only the wheel of ``tree`` (dependencies borrowed); returns its python."""
    return install_wheel(build_wheel(tree, where / "dist"), where / "venv")[0]


@contextmanager
def installed(rev: str, prefix: str = "aisim-tree-") -> Iterator[tuple[Path, str]]:
    """``(tree, python)`` of ``rev`` installed in a fresh venv; everything is removed afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as parent:
        tree = checkout(rev, Path(parent) / "tree")
        yield tree, environment(tree, Path(parent))
