"""Fixtures shared by the whole suite: real SGLang release files, real test data.

    release_version   "0.5.12.post1", the baseline release the series is made against
    release_wheel     Path of its cached wheel, verified against PyPI's sha256
                      (downloaded once through ddtree_deploy.releases; offline after)
    release_tree      a read-only folder holding the release's package files
                      (the folder that contains sglang/, like site-packages)
    data_dir          tests/data
    test_family_dir   tests/data/patches/test-0.5.12, a small real series

Tests that need the network only to fill the wheel cache take ``release_wheel``;
once the cache holds the wheel and PyPI's listing, they run offline.
"""

from __future__ import annotations

import os
import signal
import stat
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy import releases
from ddtree_deploy.errors import DeployError

BASELINE_RELEASE = "0.5.12.post1"
DATA = Path(__file__).resolve().parent / "data"


# A suite started in the background by a non-interactive shell (`make test &`, a CI runner)
# inherits SIGINT ignored, and so would every CLI process the tests start: the Ctrl-C tests
# (test_interrupt, test_json_envelope, test_serve_ssh) would then see no interrupt at all.
# A handled signal is reset to the default in an exec'd child, so handling it here gives
# each child the SIGINT a terminal's Ctrl-C delivers.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _snapshots_outside_the_repo(tmp_path_factory: pytest.TempPathFactory):
    """No test writes into the repository's snapshot/ folder (its manifests are committed):
    every test, and every process it starts, sees a copy of it instead."""
    import shutil

    copy = tmp_path_factory.mktemp("snapshot-folder") / "snapshot"
    shutil.copytree(Path(__file__).resolve().parent.parent / "snapshot", copy,
                    ignore=shutil.ignore_patterns("files"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DDTREE_DEPLOY_SNAPSHOT", str(copy))
        yield copy


@pytest.fixture(scope="session")
def release_version() -> str:
    return BASELINE_RELEASE


@pytest.fixture(scope="session")
def release_wheel(release_version: str) -> Path:
    try:
        return releases.ensure_wheel(release_version)
    except DeployError as exc:  # offline with an empty cache
        pytest.skip(f"the {release_version} wheel is not cached and PyPI is unreachable: {exc.message}")


def _make_read_only(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
    for dirpath, dirnames, _ in os.walk(root, topdown=False):
        os.chmod(dirpath, stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)


def _make_writable(root: Path) -> None:
    for dirpath, dirnames, filenames in os.walk(root):
        os.chmod(dirpath, stat.S_IRWXU)
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), stat.S_IRUSR | stat.S_IWUSR)


@pytest.fixture(scope="session")
def release_tree(release_wheel: Path, tmp_path_factory: pytest.TempPathFactory):
    """The release's ``sglang/`` package files, extracted once per session, read-only.

    Read-only so that a test which writes into it fails loudly (root ignores
    permission bits, so tests must still copy before they change anything).
    """
    root = tmp_path_factory.mktemp("release-tree")
    with zipfile.ZipFile(release_wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith("sglang/")]
        zf.extractall(root, members=members)
    _make_read_only(root)
    yield root
    _make_writable(root)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def test_family_dir() -> Path:
    return DATA / "patches" / "test-0.5.12"
