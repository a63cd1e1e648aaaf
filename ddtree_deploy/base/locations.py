"""Where things live: the repository's folders (or the installed copy) and the user's folders.

Two layouts, the same names:

* a checkout (``git clone``, ``pip install -e .``): everything is read from the
  repository's top-level folders, so an edit to a patch is seen at once;
* an installed wheel (``pipx install``, ``pip install``): the families, payload and
  release manifests come from the copy the build put under ``ddtree_deploy/_data/``
  (see setup.py); what the CLI writes goes to the user's folders instead of
  site-packages: snapshots and port trees under the cache, inventories under
  ``$XDG_CONFIG_HOME/ddtree-deploy/hosts``, the user's own families (what ``port``
  writes, what ``series refresh`` rewrites) under ``$XDG_DATA_HOME/ddtree-deploy/patches``.
  The toolkit never writes into its own install (``inside_install``).

``DDTREE_DEPLOY_<NAME>`` (PATCHES, PAYLOAD, SNAPSHOT, HOSTS, BUILD, USER_PATCHES) beats both.
Families are read from the toolkit's patches/ and, where it is a folder of its own, the
user's (``family_roots``); a family found in the user's is labelled as the user's.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: The installed package's folder (ddtree_deploy/; this module is in its base/ room).
PACKAGE_DIR = Path(__file__).resolve().parents[1]
#: The repository root when running from a checkout (the folder holding patches/, payload/).
REPO_ROOT = PACKAGE_DIR.parent
#: The data a built wheel carries (setup.py copies patches/, payload/, snapshot manifests).
PACKAGE_DATA = PACKAGE_DIR / "_data"

# Read-only folders shipped in the wheel; the others are written by the CLI.
_SHIPPED = ("patches", "payload")


def in_checkout() -> bool:
    """Running from the repository itself (its pyproject.toml and patches/ beside the package)."""
    return (REPO_ROOT / "pyproject.toml").is_file() and (REPO_ROOT / "patches").is_dir()


def repo_dir(name: str) -> Path:
    """A top-level folder of the toolkit's data; overridable by DDTREE_DEPLOY_<NAME>."""
    override = os.environ.get(f"DDTREE_DEPLOY_{name.upper()}")
    if override:
        return Path(override)
    if in_checkout():
        return REPO_ROOT / name
    if name in _SHIPPED:
        return PACKAGE_DATA / name
    if name == "snapshot":
        return _installed_snapshot_root()
    if name == "hosts":
        return config_dir() / "hosts"
    return cache_dir() / name


def _installed_snapshot_root() -> Path:
    """Snapshots of an installed toolkit live in the cache (site-packages is no place to
    write); the shipped release manifests are copied there once, so a release snapshot
    keeps its committed manifest byte for byte, as in a fresh clone."""
    root = cache_dir() / "snapshot"
    shipped = PACKAGE_DATA / "snapshot"
    if shipped.is_dir():
        for manifest in shipped.glob("*/MANIFEST.json"):
            dest = root / manifest.parent.name / manifest.name
            if not dest.exists():
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
                shutil.copyfile(manifest, tmp)
                os.replace(tmp, dest)  # two processes seeding at once: both write the same bytes
    return root


def example_inventory() -> Path:
    """The example inventory folder (a GPU host's file, groups.toml): the checkout's hosts/,
    or the copy an installed toolkit carries (setup.py)."""
    return REPO_ROOT / "hosts" if in_checkout() else PACKAGE_DATA / "examples" / "hosts"


def hosts_origin() -> str:
    """Why the default inventory folder is where it is (``hosts list`` says it)."""
    if os.environ.get("DDTREE_DEPLOY_HOSTS"):
        return "DDTREE_DEPLOY_HOSTS"
    return "the checkout's hosts/" if in_checkout() else "your config folder"


def cache_dir() -> Path:
    """The user's cache folder for downloads (wheels) and built environments."""
    override = os.environ.get("DDTREE_DEPLOY_CACHE")
    if override:
        return Path(override)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ddtree-deploy"


def data_dir() -> Path:
    """The user's data folder: what the user makes with the toolkit and keeps (XDG_DATA_HOME)."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "ddtree-deploy"


def user_patches_dir() -> Path | None:
    """The folder of the user's own families, when it is not patches/ itself.

    DDTREE_DEPLOY_USER_PATCHES when set; else None in a checkout or with DDTREE_DEPLOY_PATCHES
    (everything lives in that one patches/ folder, as it always has); else, for an installed
    toolkit, ``data_dir()/patches``.
    """
    override = os.environ.get("DDTREE_DEPLOY_USER_PATCHES")
    if override:
        return Path(override)
    if os.environ.get("DDTREE_DEPLOY_PATCHES") or in_checkout():
        return None
    return data_dir() / "patches"


USER, TOOLKIT = "user", "toolkit"  # whose a family is


def family_roots() -> list[tuple[Path, str]]:
    """The folders families are read from, with whose they are: the toolkit's, then the user's."""
    roots = [(repo_dir("patches"), TOOLKIT)]
    user = user_patches_dir()
    if user is not None:
        roots.append((user, USER))
    return roots


def new_family_root() -> Path:
    """Where a new family named by a bare name is written (port): the user's folder when there
    is one, else patches/ (a checkout, or DDTREE_DEPLOY_PATCHES)."""
    return user_patches_dir() or repo_dir("patches")


def inside_install(path: Path) -> bool:
    """Whether ``path`` lies in the installed toolkit (site-packages), which is never written.

    A checkout is the engineer's own tree: writing its patches/ is the point of port there.
    """
    if in_checkout():
        return False
    return Path(path).resolve().is_relative_to(PACKAGE_DIR)


def config_dir() -> Path:
    """The user's config folder (an installed toolkit's inventories: hosts/)."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ddtree-deploy"
