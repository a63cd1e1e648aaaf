"""Where things live: the repository's folders and the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder holding patches/, snapshot/, hosts/, payload/).
REPO_ROOT = Path(__file__).resolve().parent.parent


def repo_dir(name: str) -> Path:
    """A top-level folder of the repository; overridable by DDTREE_DEPLOY_<NAME>."""
    override = os.environ.get(f"DDTREE_DEPLOY_{name.upper()}")
    return Path(override) if override else REPO_ROOT / name


def cache_dir() -> Path:
    """The user's cache folder for downloads (wheels) and built environments."""
    override = os.environ.get("DDTREE_DEPLOY_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddtree-deploy"
