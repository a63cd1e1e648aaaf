"""The way back of a switch: (a) the switch back itself failing leaves the host MIXED, said so
and explained by `status`, and `rollback` (once the cause is gone) restores every byte;
(b) the copy fallback the agent uses where hard links fail still switches and switches back
byte for byte.

Real parts: the real agent over a real OpenSSH sshd on loopback (tests/sshd_host.py), the real
SGLang 0.5.12.post1 release files, GNU patch's result as the oracle, the real CLI. Two faults
are INJECTED through the agent's test hooks (DDTREE_DEPLOY_TEST_HOOKS), and named as such:

- ``immutable_after_renames: 1``: right after the first rename the agent runs a real
  ``chattr +i`` on the package folder, so the next file's switch and the first file's switch
  back both fail with a real EPERM from the kernel (we run as root: chmod would not stop us).
- ``no_hard_links: true``: keep_previous's os.link raises EPERM, as on a file system without
  hard links, so the agent takes its copy fallback. The rest (the copies, renames, the
  failure that triggers the switch back: an immutable .pyc, chattr +i) is real.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.base.hooks import TEST_HOOKS_ENV

from sshd_host import ADDED, SPEC, UTILS, chattr, cli, ok, temp_files  # noqa: E402

pytestmark = pytest.mark.sshd

TARGETS = (SPEC, UTILS, ADDED)
SPECDIR = "sglang/srt/speculative"


def files_of(h) -> dict:
    return {p: h.read(p) for p in TARGETS}


def journal(h) -> dict | None:
    p = h.state_dir / "journal.json"
    return json.loads(p.read_text()) if p.exists() else None


def hooks(monkeypatch, **kw) -> None:
    monkeypatch.setenv(TEST_HOOKS_ENV, json.dumps(kw))


# ---------------------------------------------------------------- (a) the switch back fails


def test_switch_back_failing_leaves_mixed_explained_then_rollback_restores(host, oracle, monkeypatch):
    pristine, patched = oracle
    folder = host.site / SPECDIR
    assert files_of(host) == pristine
    chattr("+i", folder)  # probe once that this file system takes the flag (else: skip)
    subprocess.run(["chattr", "-i", str(folder)], check=True)
    try:
        hooks(monkeypatch, immutable_after_renames=1)  # INJECTED: chattr +i after rename 1
        failed = cli("push", "--host", host.name)
        monkeypatch.delenv(TEST_HOOKS_ENV)
        out = failed.output
        assert failed.exit_code == 1, out
        assert "MIXED" in out and "switching back also failed" in out and "EPERM" in out, out
        assert "journal says `switching`" in out and "rollback" in out, out
        # Each file is named by its package path; the one that could not go back says where its
        # previous version waits (the only temp file the message names).
        assert f"switch failed: {SPECDIR}/" in out and f"back also failed ({SPECDIR}/" in out, out
        assert out.count(".ddtree-tmp-") == 1 and "its previous version is kept at /" in out, out

        # Exactly one file was switched and could not go back; the others never changed.
        now = files_of(host)
        flipped = [p for p in TARGETS if now[p] == patched[p] and now[p] != pristine[p]]
        assert len(flipped) == 1 and all(now[p] == pristine[p] for p in TARGETS if p not in flipped), now
        assert journal(host)["phase"] == "switching" and journal(host)["op"] == "push"

        # status (read-only, works while the folder is still immutable) explains every file.
        read = cli("status", "--host", host.name, "--json")
        assert read.exit_code == 1, read.output  # interrupted mid-switch: needs a person
        doc = json.loads(read.stdout)["hosts"][0]
        states = {f["path"]: f["state"] for f in doc["files"]}
        assert states == {p: ("patched" if p in flipped else "pristine") for p in TARGETS}, states
        assert doc["phase"] == "switching"
        assert "1 patched, 2 pristine" in doc["explanation"], doc["explanation"]
        assert "rerun `push`" in doc["explanation"] and "`rollback`" in doc["explanation"], doc["explanation"]
        human = cli("status", "--host", host.name).stdout
        assert "phase: switching" in human, human
        for p in TARGETS:
            assert p in human, human
        assert "1 patched, 2 pristine" in human and "rollback" in human, human
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)  # the cause removed

    # rollback restores every file byte for byte (and sweeps the kept previous version).
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine
    assert journal(host)["phase"] == "rolled-back" and not temp_files(host.site, host.state_dir)
    # and the host is whole again: a push completes.
    ok("push", "--host", host.name)
    assert files_of(host) == patched and journal(host)["phase"] == "deployed"


# ---------------------------------------------------------------- (b) no hard links: copies


def test_without_hard_links_push_and_rollback_are_byte_identical(host, oracle, monkeypatch):
    pristine, patched = oracle
    spec = host.file(SPEC)
    os.chmod(spec, 0o640)
    hooks(monkeypatch, no_hard_links=True)  # INJECTED: os.link fails with EPERM
    ok("push", "--host", host.name)
    assert files_of(host) == patched and journal(host)["phase"] == "deployed"
    assert spec.stat().st_mode & 0o7777 == 0o640
    assert not temp_files(host.site, host.state_dir)
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine and journal(host)["phase"] == "rolled-back"
    assert spec.stat().st_mode & 0o7777 == 0o640
    assert not temp_files(host.site, host.state_dir)


def _compile(h, rel):
    subprocess.run([str(h.python), "-m", "py_compile", str(h.file(rel))], check=True)
    return next((h.file(rel).parent / "__pycache__").glob(Path(rel).stem + ".*.pyc"))


def switched_back(host, failed) -> None:
    """A switch that failed on EPERM and was switched back, as the error's fields say it (its
    ``changed``, not a phrase that the line under ``error:`` would also print)."""
    assert failed.exit_code == 1, failed.output
    error = json.loads(failed.stdout)["error"]
    assert (error["code"], error["host"], error["step"], error["changed"]) == \
        ("failed-unchanged", host.name, "apply", "no"), error
    assert error["message"].startswith(f"{host.name}: apply: switch failed, host unchanged: ") \
        and "(errno EPERM)" in error["message"], error["message"]
    assert f"error: {error['message']}\nhost unchanged\n" in failed.stderr, failed.stderr


def test_without_hard_links_a_failed_switch_is_switched_back_from_the_copies(host, oracle, monkeypatch):
    """The switch fails after renames (an immutable .pyc cannot be purged, a real EPERM); the
    switched files go back from the copies the fallback kept: a new inode (so the copy, not a
    link, was put back), the same bytes and mode. Push and rollback both."""
    pristine, patched = oracle
    os.chmod(host.file(SPEC), 0o640)
    inodes = {p: host.file(p).stat().st_ino for p in (SPEC, UTILS)}
    pyc = _compile(host, UTILS)
    chattr("+i", pyc)
    try:
        hooks(monkeypatch, no_hard_links=True)  # INJECTED: os.link fails with EPERM
        switched_back(host, cli("push", "--host", host.name, "--json"))
        assert files_of(host) == pristine and journal(host) is None
        assert not temp_files(host.site, host.state_dir)
        assert host.file(SPEC).stat().st_mode & 0o7777 == 0o640
        put_back = [p for p in (SPEC, UTILS) if host.file(p).stat().st_ino != inodes[p]]
        assert put_back, "no file was switched back from a copy: the fallback did not run"
    finally:
        subprocess.run(["chattr", "-i", str(pyc)], check=True)

    ok("push", "--host", host.name)
    assert files_of(host) == patched
    deployed = journal(host)
    inodes = {p: host.file(p).stat().st_ino for p in TARGETS}
    pyc = _compile(host, UTILS)
    chattr("+i", pyc)
    try:
        switched_back(host, cli("rollback", "--host", host.name, "--json"))
        assert files_of(host) == patched and journal(host) == deployed
        assert not temp_files(host.site, host.state_dir)
        assert any(host.file(p).stat().st_ino != inodes[p] for p in TARGETS if p != ADDED)
    finally:
        subprocess.run(["chattr", "-i", str(pyc)], check=True)
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine and host.file(SPEC).stat().st_mode & 0o7777 == 0o640


def test_switch_back_failing_then_rerun_push_completes_and_rollback_is_pristine(host, oracle, monkeypatch):
    """The other way out the MIXED error names: rerun push. It completes the switch, and a
    later rollback still restores the release files (not the mixed state the rerun found)."""
    pristine, patched = oracle
    folder = host.site / SPECDIR
    chattr("+i", folder)  # probe once that this file system takes the flag (else: skip)
    subprocess.run(["chattr", "-i", str(folder)], check=True)
    try:
        hooks(monkeypatch, immutable_after_renames=1)  # INJECTED: chattr +i after rename 1
        failed = cli("push", "--host", host.name)
        monkeypatch.delenv(TEST_HOOKS_ENV)
        assert failed.exit_code == 1 and "MIXED" in failed.output, failed.output
        assert journal(host)["phase"] == "switching"
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=True)
    ok("push", "--host", host.name)
    assert files_of(host) == patched and journal(host)["phase"] == "deployed"
    assert not temp_files(host.site, host.state_dir)
    ok("rollback", "--host", host.name)
    assert files_of(host) == pristine and journal(host)["phase"] == "rolled-back"
