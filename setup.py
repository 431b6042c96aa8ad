"""Packaging: the repository's top-level folders become subpackages of the one ``aisim`` namespace.

``simulator/`` installs as ``aisim.simulator``, ``actors/`` as ``aisim.actors``, ``search/`` as
``aisim.search`` and ``configs/`` as ``aisim.configs``; nothing else lands in site-packages. The
package list is derived from the folders (every directory with an ``__init__.py``), so a new module
needs no entry here. Everything else about the distribution is in pyproject.toml.
"""

from setuptools import find_packages, setup

MAPPED = ("simulator", "actors", "search", "configs")  # folder == subpackage name under aisim

packages = ["aisim"] + [f"aisim.{p}" for p in find_packages(include=[f"{m}" for m in MAPPED] + [f"{m}.*" for m in MAPPED])]
package_dir = {"aisim": "aisim", **{f"aisim.{m}": m for m in MAPPED}}

setup(packages=packages, package_dir=package_dir)
