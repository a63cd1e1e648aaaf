"""How this toolkit was installed, and the one command that adds an optional extra to it.

A hint that says ``pip install`` to a user who installed with pipx sends the packages into
another environment: pipx keeps each application in its own venv, reached with ``pipx
inject``. The packages are the extra's own, as the installed distribution declares them
(pyproject.toml's optional-dependencies, in the wheel's metadata): one list, never retyped.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

DIST = "ddtree-deploy"


def installed_by_pipx(prefix: str | None = None) -> bool:
    """The running interpreter's environment is one pipx made (it writes pipx_metadata.json there)."""
    return (Path(prefix or sys.prefix) / "pipx_metadata.json").is_file()


def extra_requirements(extra: str, requires: list[str] | None = None) -> list[str]:
    """The requirements of ``extra`` (``demo``, ``tune``, ``ansible``) as this toolkit declares
    them, without their markers: a checkout's pyproject.toml (an editable install's metadata
    is as old as the install), else the installed distribution's metadata; ``requires``:
    metadata lines given (tests)."""
    if requires is None:
        from ddtree_deploy.base.locations import REPO_ROOT, in_checkout

        if in_checkout() and (REPO_ROOT / "pyproject.toml").is_file():
            from ddtree_deploy.base.toml_input import tomllib  # 3.11's, or tomli on 3.10

            with open(REPO_ROOT / "pyproject.toml", "rb") as fh:
                declared = tomllib.load(fh).get("project", {}).get("optional-dependencies", {})
            return list(declared.get(extra, []))
        from importlib.metadata import PackageNotFoundError, requires as dist_requires

        try:
            requires = dist_requires(DIST) or []
        except PackageNotFoundError:
            requires = []
    wanted = re.compile(r"""extra\s*==\s*["']%s["']""" % re.escape(extra))
    out = []
    for line in requires:
        req, _, marker = line.partition(";")
        if wanted.search(marker):
            out.append(req.strip())
    return out


def add_extra(extra: str, *, pipx: bool | None = None) -> str:
    """The one command, in backticks, that installs ``extra``'s packages where this toolkit
    runs: ``pipx inject ddtree-deploy ...`` under pipx, else this interpreter's ``-m pip
    install ...`` (a venv, a checkout's .venv)."""
    reqs = extra_requirements(extra) or [f"{DIST}[{extra}]"]
    words = " ".join(shlex.quote(r) for r in reqs)
    if installed_by_pipx() if pipx is None else pipx:
        return f"`pipx inject {DIST} {words}`"
    return f"`{shlex.quote(sys.executable)} -m pip install {words}`"


__all__ = ["DIST", "add_extra", "extra_requirements", "installed_by_pipx"]
