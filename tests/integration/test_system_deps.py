"""scripts/system-deps.sh (run by `make test`, `make demo` and .ci/run) and the missing-sshd message.

The "missing tool" cases hide the tool with a PATH made of links to the real tools minus
the hidden one, and forbid installing (DDTREE_DEPLOY_NO_SYSTEM_INSTALL=1, --check, or no
apt-get on PATH): nothing is uninstalled, nothing is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
SCRIPT = REPO / "scripts" / "system-deps.sh"
TOOLS = ("bash", "env", "id", "grep", "make", "git", "rsync", "patch", "sshd", "podman", "runc", "catatonit",
         "debootstrap")

from ddtree_deploy.sandbox import sshd as sshd_host  # noqa: E402


def _bin(tmp: Path, hide: tuple[str, ...] = ()) -> Path:
    """A PATH folder with links to this machine's tools, minus ``hide``."""
    folder = tmp / "bin"
    folder.mkdir()
    for tool in TOOLS:
        real = shutil.which(tool, path=os.environ["PATH"] + ":/usr/sbin:/sbin")
        if tool not in hide and real:
            (folder / tool).symlink_to(real)
    return folder


def _run(path: Path, *args: str, **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": str(path), "HOME": os.environ.get("HOME", "/tmp"), **extra}
    return subprocess.run([shutil.which("bash"), str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_this_machine_has_every_tool(tmp_path):
    r = _run(_bin(tmp_path), DDTREE_DEPLOY_NO_SYSTEM_INSTALL="1")
    assert (r.returncode, r.stderr) == (0, "")


def test_a_missing_tool_is_one_line_saying_what_to_install(tmp_path):
    r = _run(_bin(tmp_path, hide=("rsync",)), DDTREE_DEPLOY_NO_SYSTEM_INSTALL="1")
    assert r.returncode == 1
    lines = r.stderr.splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("missing system tools: rsync (rsync); install them first: ")
    assert "apt-get install -y rsync " in lines[0]


def test_a_missing_podman_is_one_line_naming_the_package(tmp_path):
    r = _run(_bin(tmp_path, hide=("podman",)), DDTREE_DEPLOY_NO_SYSTEM_INSTALL="1")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1, r.stderr
    assert "podman (podman)" in r.stderr and "apt-get install -y podman" in r.stderr


def test_a_missing_sshd_names_openssh_server(tmp_path):
    r = _run(_bin(tmp_path, hide=("sshd",)), "--check", SSHD=str(tmp_path / "no-sshd"))
    assert r.returncode == 1
    assert "sshd (openssh-server)" in r.stderr and "apt-get install -y openssh-server" in r.stderr


def test_several_missing_tools_are_named_together(tmp_path):
    r = _run(_bin(tmp_path, hide=("git", "rsync")), "--check")
    assert r.returncode == 1 and len(r.stderr.splitlines()) == 1
    assert "git (git), rsync (rsync)" in r.stderr and "apt-get install -y git rsync" in r.stderr


def test_a_patch_that_is_not_gnu_is_missing_gnu_patch(tmp_path):
    folder = _bin(tmp_path, hide=("patch",))
    # A stand-in for a BSD/macOS patch: a `patch` whose --version is not GNU's.
    (folder / "patch").write_text("#!/bin/sh\necho 'patch 2.0-12u11-Apple'\n")
    (folder / "patch").chmod(0o755)
    r = _run(folder, "--check")
    assert r.returncode == 1
    assert "GNU patch, found" in r.stderr and "which is not GNU (patch)" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the install branch is only taken as root")
def test_as_root_without_apt_it_stops_instead_of_installing(tmp_path):
    # No DDTREE_DEPLOY_NO_SYSTEM_INSTALL: only the absent apt-get keeps it from installing.
    r = _run(_bin(tmp_path, hide=("rsync",)))
    assert r.returncode == 1
    assert r.stderr.startswith("missing system tools: rsync (rsync); install them first: apt-get install")


def test_make_test_stops_before_the_tests(tmp_path):
    folder = _bin(tmp_path, hide=("rsync",))
    env = {"PATH": str(folder), "HOME": os.environ.get("HOME", "/tmp"), "DDTREE_DEPLOY_NO_SYSTEM_INSTALL": "1"}
    # -n past system-deps would print the install/pytest commands; system-deps runs first and fails.
    r = subprocess.run([str(folder / "make"), "-s", "-C", str(REPO), "system-deps"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2  # make's own "a recipe failed"
    assert "missing system tools: rsync (rsync)" in r.stderr
    plan = subprocess.run([str(folder / "make"), "-n", "--no-print-directory", "-C", str(REPO), "test"], env=env,
                          capture_output=True, text=True, timeout=60).stdout.splitlines()
    # ... and `make test` (and `make demo`) run it before installing or testing anything.
    assert plan[0] == "bash scripts/system-deps.sh", plan[:3]
    demo = subprocess.run([str(folder / "make"), "-n", "--no-print-directory", "-C", str(REPO), "demo"], env=env,
                          capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert demo[0] == "bash scripts/system-deps.sh", demo[:3]


def test_sshd_host_names_the_package_when_sshd_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(sshd_host, "SSHD", str(tmp_path / "no-sshd"))
    with pytest.raises(pytest.fail.Exception, match=r"sshd not found .*install openssh-server"):
        sshd_host.SSHServer(tmp_path / "srv").start()
