"""The deploy tests' real series on sandbox hosts, and the sshd/host fixtures they share.

The sshd and the hosts themselves are ddtree_deploy.sandbox (the demo and the benchmarks
use them too): SSHServer (OpenSSH on loopback), SandboxHost, make_python_env. Here only
what the tests add: the small real series under tests/data/deploy_series, GNU patch's
result for it (the oracle), and the module-wide sshd + one-host-per-test fixtures, which
tests/conftest.py registers for every test module (importing them here by name, as modules
did before, still works), with the CLI helpers below (cli, ok) and the fault helpers
(temp_files, chattr) the deploy tests share:

    from sshd_host import ADDED, SPEC, UTILS, cli, ok
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.sandbox import SandboxHost, SSHServer

# The small real series the deploy tests push (tests/data/deploy_series): two patches, one add.
DEPLOY_SERIES = Path(__file__).resolve().parent / "data" / "deploy_series"
DEPLOY_FAMILY = DEPLOY_SERIES / "patches" / "sglang-0.5.12"
SPEC = "sglang/srt/speculative/spec_info.py"
UTILS = "sglang/srt/speculative/dflash_utils.py"
ADDED = "sglang/srt/speculative/ddtree_deploy_test_marker.py"

_names = itertools.count()


def series_covering_elsewhere(tmp_path: Path) -> Path:
    """A copy of the deploy series whose one family covers 0.5.13 only, not the sandbox's
    0.5.12.post1: a push there is refused by its series check. Returns its patches folder."""
    copy = tmp_path / "series_covering_elsewhere"
    shutil.copytree(DEPLOY_SERIES, copy)
    toml = copy / "patches" / "sglang-0.5.12" / "family.toml"
    toml.write_text(toml.read_text().replace('sglang = ">=0.5.12,<0.5.13"', 'sglang = ">=0.5.13,<0.5.14"'))
    return copy / "patches"


def deploy_series_oracle(server: SSHServer, work: Path) -> tuple[dict, dict]:
    """(pristine, patched) bytes per target of the small deploy series: the release files,
    and what GNU patch makes of them (plus the file the series adds)."""
    ref = server.add_host("oracle", work / "ref", files=[SPEC, UTILS])
    tree = work / "tree"
    shutil.copytree(ref.site / "sglang", tree / "sglang")
    for patch in sorted(DEPLOY_FAMILY.glob("*.patch")):
        subprocess.run(["patch", "-p1", "-s", "--no-backup-if-mismatch", "-i", str(patch)], cwd=tree, check=True)
    patched = {p: (tree / p).read_bytes() for p in (SPEC, UTILS)}
    patched[ADDED] = (DEPLOY_SERIES / "payload" / "ddtree_deploy_test_marker.py").read_bytes()
    return {SPEC: ref.read(SPEC), UTILS: ref.read(UTILS), ADDED: None}, patched


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """One real sshd on loopback for the whole test module."""
    with SSHServer(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="module")
def oracle(tmp_path_factory, sshd):
    """The patched files as GNU patch makes them from the release files (plus the added file)."""
    return deploy_series_oracle(sshd, tmp_path_factory.mktemp("oracle"))


@pytest.fixture
def host(sshd, tmp_path, monkeypatch) -> SandboxHost:
    """A fresh host (the two files the series touches) whose inventory pushes the small
    real series, with no smoke after push; the CLI finds it by name."""
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    h = sshd.add_host(f"host{next(_names)}", tmp_path / "host", files=[SPEC, UTILS])
    h.inventory(smoke_levels=[])  # smoke after push: tested on its own (test_smoke_push.py)
    return h


def cli(*args: str):
    """The real CLI, in process."""
    return CliRunner().invoke(app, list(args))


def ok(*args: str):
    result = cli(*args)
    assert result.exit_code == 0, result.output
    return result


def temp_files(*roots) -> list:
    """Our temporary files (the agent's TMP_TAG) anywhere below ``roots``."""
    return [p for r in roots for p in Path(r).rglob("*") if ".ddtree-tmp-" in p.name]


def chattr(flag: str, path: Path) -> None:
    """A real ``chattr`` (immutable / append-only inodes as faults), else skip saying why."""
    if not shutil.which("chattr"):
        pytest.skip("chattr (e2fsprogs) is not installed: the faults here are immutable inodes")
    r = subprocess.run(["chattr", flag, str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"chattr {flag} refused on this file system ({r.stderr.strip()})")


def wait_stopped(pid: int, deadline_s: float = 60.0) -> None:
    """Wait until host program ``pid`` is stopped (SIGSTOP: state T) at its test hook
    ``stop_before_each_request``; fails after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        assert time.monotonic() < deadline, f"host program {pid} never stopped at its hook"
        time.sleep(0.01)
