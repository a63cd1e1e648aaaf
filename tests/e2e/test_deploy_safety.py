"""Issue 11 (deploy part): never half-patched, never a byte outside the package's targets and
the marked state dir, bounded and deadlined agent replies, host text printed inert.

Everything runs against a real OpenSSH sshd on loopback (ddtree_deploy/sandbox/sshd.py) and the real
SGLang 0.5.12.post1 files. Faults are real: ENOSPC from a small tmpfs mounted under the
package (we are root in this sandbox; skipped with the reason where mount is refused),
chattr +i from e2fsprogs on ext4, a __pycache__ owned by root while the agent runs as the
unprivileged user ``nobody`` (setpriv), and host programs that stall or flood (a wrapper
given as the host's interpreter, i.e. the host's side misbehaving, not a mocked client).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base import hooks
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.cli import app
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.remote.agent_session import AgentSession
from ddtree_deploy.remote.ssh import SSHTransport
from ddtree_deploy.session import push as host_push
from ddtree_deploy.session import status as host_status
from ddtree_deploy.session.desired import desired_for
from ddtree_deploy.settings.inventory import load_host

from ddtree_deploy.sandbox import make_python_env  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, chattr, temp_files  # noqa: E402
from sshd_host import DEPLOY_FAMILY as FAMILY  # noqa: E402

pytestmark = pytest.mark.sshd

TARGETS = [SPEC, UTILS, ADDED]
SPECDIR = "sglang/srt/speculative"


@pytest.fixture(scope="module")
def series():
    return load_family(FAMILY)


@pytest.fixture
def env(monkeypatch, tmp_path):
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV, raising=False)


def new_host(sshd, tmp_path, name="h", **keys):
    h = sshd.add_host(name, tmp_path / name, files=[SPEC, UTILS])
    return h, load_host(str(h.inventory(tmp_path / f"inv-{name}", **keys)))


def push(host, series, **kw):
    return host_push.push(host, SSHTransport(host), TARGETS, lambda f: desired_for(series, host.name, f), **kw)


def rollback(host, **kw):
    return host_push.rollback(host, SSHTransport(host), **kw)


def files(h):
    return {p: h.read(p) for p in TARGETS}


def journal(h):
    p = h.state_dir / "journal.json"
    return json.loads(p.read_text()) if p.exists() else None


def mount_tmpfs(folder: Path, size: str):
    """Mount a tmpfs of ``size`` on ``folder`` keeping its files; skip when mount is refused."""
    keep = folder.parent / (folder.name + ".orig")
    shutil.copytree(folder, keep)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=755", "tmpfs", str(folder)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        shutil.rmtree(keep)
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.strip()}): ENOSPC needs a small file system")
    for p in keep.iterdir():
        (shutil.copytree if p.is_dir() else shutil.copy2)(p, folder / p.name)
    return lambda: subprocess.run(["umount", "-l", str(folder)], check=False)


# ---------------------------------------------------------------- item 1, 2: all or nothing


def test_no_room_is_refused_by_the_preflight(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    umount = mount_tmpfs(h.site / SPECDIR, "256k")
    try:
        before = files(h)
        with pytest.raises(DeployError) as e:
            push(host, series)
        assert e.value.code == "no-space" and "free space" in e.value.message, e.value.message
        assert files(h) == before and journal(h) is None
        assert not temp_files(h.site, h.state_dir) and not (h.state_dir / "backups").exists()
    finally:
        umount()


def test_enospc_during_the_switch_switches_back(sshd, tmp_path, env, series, monkeypatch):
    """The preflight passes, then the disk fills (a test hook writes a filler file after the
    staging, standing in for another process): the 2nd file's copy fails with ENOSPC and the
    first, already switched, is switched back in the same op."""
    h, host = new_host(sshd, tmp_path)
    folder = h.site / SPECDIR
    umount = mount_tmpfs(folder, "8m")
    try:
        before = files(h)
        monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"fill_after_staging": [str(folder), 16384]}))
        with pytest.raises(DeployError) as e:
            push(host, series)
        monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
        msg = e.value.message
        assert e.value.code == "failed-unchanged" and "host unchanged" in msg and "ENOSPC" in msg, msg
        assert (e.value.changed, e.value.host, e.value.step) == (Changed.NO, h.name, "apply"), e.value.to_json()
        assert "dflash_utils.py" in msg and "1 file(s) already switched were switched back" in msg, msg
        assert files(h) == before and journal(h) is None
        assert not temp_files(h.site, h.state_dir), temp_files(h.site, h.state_dir)
        (folder / "ddtree-test-filler").unlink()
        assert push(host, series).changed and files(h) != before
        assert rollback(host).changed and files(h) == before
    finally:
        umount()


def test_journal_write_failing_after_the_switch_switches_back(sshd, tmp_path, env, series, monkeypatch):
    """The state dir's file system fills after the staging (the hook again): every file is
    switched, then the final journal cannot be written: the files go back, host unchanged."""
    h, host = new_host(sshd, tmp_path)
    h.state_dir.mkdir()
    umount = mount_tmpfs(h.state_dir, "8m")
    try:
        before = files(h)
        monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"fill_after_staging": [str(h.state_dir), 0]}))
        with pytest.raises(DeployError) as e:
            push(host, series)
        monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
        msg = e.value.message
        assert e.value.code == "failed-unchanged" and "journal failed, host unchanged" in msg and "ENOSPC" in msg, msg
        assert (e.value.changed, e.value.host, e.value.step) == (Changed.NO, h.name, "apply"), e.value.to_json()
        # The journal named, not our temporary copy of it (nor the step twice).
        assert f"host unchanged: {h.state_dir}/journal.json: No space left on device (errno ENOSPC)" in msg, msg
        assert files(h) == before and journal(h) is None and not temp_files(h.site)
        (h.state_dir / "ddtree-test-filler").unlink()
        assert push(host, series).changed and journal(h)["phase"] == "deployed"
    finally:
        umount()


def test_immutable_target_is_refused_before_any_write(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    before = files(h)
    chattr("+i", h.file(UTILS))
    try:
        with pytest.raises(DeployError) as e:
            push(host, series)
        assert e.value.code == "preflight" and "immutable" in e.value.message and UTILS in e.value.message
        assert files(h) == before and journal(h) is None and not temp_files(h.site, h.state_dir)
    finally:
        subprocess.run(["chattr", "-i", str(h.file(UTILS))])


def _compile(h, rel):
    subprocess.run([str(h.python), "-m", "py_compile", str(h.file(rel))], check=True)
    return next((h.file(rel).parent / "__pycache__").glob(Path(rel).stem + ".*.pyc"))


def test_failed_purge_switches_back_push_and_rollback(sshd, tmp_path, env, series):
    """An immutable .pyc cannot be purged (EPERM, after the rename): push and rollback each
    switch every file back in the same op and say `host unchanged`, naming file and errno."""
    h, host = new_host(sshd, tmp_path)
    before = files(h)
    pyc = _compile(h, UTILS)
    chattr("+i", pyc)
    try:
        with pytest.raises(DeployError) as e:
            push(host, series)
        assert e.value.code == "failed-unchanged" and "EPERM" in e.value.message and pyc.name in e.value.message
        assert (e.value.changed, e.value.host, e.value.step) == (Changed.NO, h.name, "apply"), e.value.to_json()
        assert files(h) == before and journal(h) is None and not temp_files(h.site, h.state_dir)
    finally:
        subprocess.run(["chattr", "-i", str(pyc)])
    assert push(host, series).changed
    patched, deployed = files(h), journal(h)
    pyc = _compile(h, UTILS)
    chattr("+i", pyc)
    try:
        with pytest.raises(DeployError) as e:
            rollback(host)
        assert e.value.code == "failed-unchanged" and "EPERM" in e.value.message
        assert (e.value.changed, e.value.host, e.value.step) == (Changed.NO, h.name, "apply"), e.value.to_json()
        assert files(h) == patched and journal(h) == deployed and not temp_files(h.site, h.state_dir)
    finally:
        subprocess.run(["chattr", "-i", str(pyc)])
    assert rollback(host).changed and files(h) == before


def test_stale_temp_files_of_a_dead_run_are_swept(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    stale = h.file(SPECDIR) / ".spec_info.py.ddtree-tmp-99999"
    stale.write_bytes(b"x" * 1000)
    push(host, series)
    assert not stale.exists() and not temp_files(h.site, h.state_dir)


def test_a_run_killed_after_its_last_rename_leaves_nothing_after_the_rerun(sshd, tmp_path, env, series, monkeypatch):
    """#22: the rerun that completes a killed run's journal switches nothing (no apply), so it
    used to leave the killed run's previous-version hard links (each holding the other
    version's blocks) and staging/<run>/. Every run sweeps under the lock it takes, in every
    folder its state names."""
    h, host = new_host(sshd, tmp_path)
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"exit_after_renames": len(TARGETS)}))
    with pytest.raises(DeployError, match="agent stopped during apply"):
        push(host, series)
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    left = temp_files(h.site)
    assert left and all(".ddtree-tmp-prev-" in p.name for p in left), left
    assert any((h.state_dir / "staging").iterdir())
    done = push(host, series)  # completes the journal only: nothing to switch
    assert not done.changed and done.phase == "deployed" and "journal completed" in done.summary
    assert temp_files(h.site, h.state_dir) == [] and not (h.state_dir / "staging").exists()


def test_a_lock_attempt_on_a_full_state_folder_leaves_no_half_made_lock(sshd, tmp_path, env, series):
    """#22: each lock attempt on a full state file system left an empty lock.ddtree-tmp-<run>/."""
    h, host = new_host(sshd, tmp_path)
    push(host, series)
    umount = mount_tmpfs(h.state_dir, "4m")
    try:
        filler = h.state_dir / "filler"
        with open(filler, "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError:
                pass  # ENOSPC: the state folder's file system is full
        for _attempt in range(3):
            with pytest.raises(DeployError) as e:
                rollback(host)
            # The step once, then where and why (it said `h: lock: lock: No space left on device`).
            assert e.value.message == (f"{host.name}: lock: {h.state_dir}/lock: No space left on device "
                                       "(errno ENOSPC)"), e.value.message
        assert [p.name for p in h.state_dir.iterdir() if ".ddtree-tmp-" in p.name] == []
        assert not (h.state_dir / "lock").exists()
        filler.unlink()
        assert rollback(host).changed
    finally:
        umount()


def test_pycache_of_another_user_is_refused_for_an_unprivileged_agent(sshd, env, series):
    """The agent runs as `nobody` (setpriv); a root process compiled the package once, so
    its __pycache__ is root's: the preflight refuses, naming the folder; nothing changes."""
    if not shutil.which("setpriv") or not Path("/usr/bin/python3").exists() or os.geteuid() != 0:
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run the agent as another user")
    base = Path(tempfile.mkdtemp(prefix="ddtree-priv-", dir="/tmp"))
    try:
        base.chmod(0o755)
        _py, site = make_python_env(base / "env", [SPEC, UTILS])
        state = base / "state"
        for p in [base / "env", *(base / "env").rglob("*")]:
            os.lchown(p, 65534, 65534)
        subprocess.run(["/usr/bin/python3", "-m", "py_compile", str(site / UTILS)], check=True)  # as root
        wrapper = base / "python-as-nobody"
        wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups "
                           f"env PYTHONPATH={site} HOME={base} /usr/bin/python3 \"$@\"\n")
        wrapper.chmod(0o755)
        os.chown(base, 65534, 65534)
        from ddtree_deploy.sandbox import SandboxHost as TestHost

        h = TestHost("nobody", sshd, wrapper, site, state)
        host = load_host(str(h.inventory(base / "inv")))
        before = files(h)
        with pytest.raises(DeployError) as e:
            push(host, series)
        assert e.value.code == "permission" and "__pycache__" in e.value.message, e.value.message
        assert files(h) == before and not (state / "journal.json").exists() and not temp_files(site, state)
        os.chown(site / SPECDIR / "__pycache__", 65534, 65534)
        assert push(host, series).changed  # as nobody, once the folder is the deploy user's
        assert (site / SPEC).stat().st_uid == 65534
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---------------------------------------------------------------- item 3: killed after the last rename


def test_killed_after_the_last_rename_rerun_runs_the_smoke_then_deploys(sshd, tmp_path, env, series, monkeypatch):
    from ddtree_deploy.fleets import rollout

    h, host = new_host(sshd, tmp_path)
    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"exit_after_renames": 3}))
    with pytest.raises(DeployError, match="agent stopped during apply"):
        push(host, series, smoke=True)
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    killed = journal(h)
    assert killed["phase"] == "switching"
    patched = files(h)
    results = []
    with host_push.begin_push(host, SSHTransport(host), TARGETS, lambda f: desired_for(series, host.name, f),
                           smoke=True) as held:
        assert held.locked
        rerun = held.outcome
        results.append(rollout.after_push(host, lambda: SSHTransport(host), rerun, series, levels=["compile"],
                                          held=held))
    assert "already deployed" not in rerun.summary and rerun.smoke_pending == killed["run_id"], rerun.summary
    assert results and results[0].report is not None and results[0].ok and results[0].marked
    assert journal(h)["phase"] == "deployed" and journal(h)["run_id"] == killed["run_id"] and files(h) == patched

    monkeypatch.setenv(hooks.TEST_HOOKS_ENV, json.dumps({"exit_after_renames": 3}))
    with pytest.raises(DeployError, match="agent stopped during apply"):
        rollback(host)
    monkeypatch.delenv(hooks.TEST_HOOKS_ENV)
    assert journal(h)["phase"] == "switching"
    again = rollback(host)
    assert journal(h)["phase"] == "rolled-back" and "completed" in again.summary, again.summary
    assert host_status.status(host, SSHTransport(host))["phase"] == "rolled-back"


# ---------------------------------------------------------------- item 4: state_dir


def _cli(*args):
    return CliRunner().invoke(app, list(args))


def test_state_dir_that_is_not_ours_is_refused(sshd, tmp_path, env, monkeypatch, series):
    h, _host = new_host(sshd, tmp_path)
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    theirs = tmp_path / "someone-elses"
    (theirs / "staging" / "keep").mkdir(parents=True)
    (theirs / "journal.json").write_text('{"mine": true}\n')
    cases = {
        "foreign": str(theirs),
        "inside": str(h.site / "sglang" / ".state"),
        "above": str(h.site.parent),
        "relative": "state/here",
        "climbs": str(tmp_path) + "/x/../y",
        "shell": str(tmp_path) + "/$(id)",
    }
    before = files(h)
    for name, state in cases.items():
        h.state_dir = state
        h.inventory(tmp_path / "hosts")
        r = _cli("push", "--host", "h", "--family", str(FAMILY), "--no-smoke")
        assert r.exit_code == 2, (name, r.output)
        assert "state_dir" in r.stderr and "Traceback" not in r.output, (name, r.stderr)
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, (name, r.stderr)
        st = _cli("status", "--host", "h")  # read-only, and refused all the same
        assert st.exit_code == 2 and "state_dir" in st.stderr, (name, st.output)
    assert (theirs / "staging" / "keep").is_dir() and json.loads((theirs / "journal.json").read_text()) == {"mine": True}
    assert not (h.site / "sglang" / ".state").exists() and not (tmp_path / "h" / "state").exists()
    assert files(h) == before and not Path(str(tmp_path) + "/$(id)").exists()


def test_state_dir_from_before_the_marker_is_adopted(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    assert push(host, series).changed
    marker = h.state_dir / ".ddtree-deploy-state"
    assert marker.is_file()
    marker.unlink()  # a host deployed by an older ddtree-deploy: our layout, no marker
    assert host_status.status(host, SSHTransport(host))["phase"] == "deployed"
    assert rollback(host).changed and marker.is_file()
    marker.unlink()
    (h.state_dir / "notes.txt").write_text("mine\n")  # anything else: not ours any more
    with pytest.raises(DeployError) as e:
        push(host, series)
    assert e.value.exit_code == 2 and "notes.txt" in e.value.message
    assert (h.state_dir / "notes.txt").read_text() == "mine\n"


# ---------------------------------------------------------------- item 5: bytecode purge


def test_symlinked_pycache_is_never_followed(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    victim = outside / "spec_info.cpython-311.pyc"
    victim.write_bytes(b"not ours")
    cache = h.file(SPECDIR) / "__pycache__"
    shutil.rmtree(cache, ignore_errors=True)
    cache.symlink_to(outside)
    before = files(h)
    with pytest.raises(DeployError) as e:
        push(host, series)
    assert e.value.code == "unsafe-file" and "__pycache__ is a symlink" in e.value.message
    assert victim.read_bytes() == b"not ours" and files(h) == before


# ---------------------------------------------------------------- item 6: host text printed inert


def test_host_text_is_printed_escaped(sshd, tmp_path, env, series, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    monkeypatch.setenv("COLUMNS", "400")
    h = sshd.add_host("esc", tmp_path / "v[prod]env", files=[SPEC, UTILS])
    h.inventory(tmp_path / "hosts")
    host = load_host("esc")
    push(host, series)
    doc = journal(h)
    doc["series"] = "fam[/]ily"
    doc["backup_id"] = "[bold]b[/bold]"
    (h.state_dir / "journal.json").write_text(json.dumps(doc))
    (h.state_dir / "lock").mkdir()
    (h.state_dir / "lock" / "owner.json").write_text(json.dumps(
        {"holder": "\x1b[31mevil\nerror: forged line", "run_id": "r[/]", "time": "t", "command": "push"}))
    for args in (["status", "--host", "esc"], ["status", "--host", "esc", "--host", "esc2"]):
        if "esc2" in args:
            h2 = sshd.add_host("esc2", tmp_path / "esc2", files=[SPEC, UTILS])
            h2.inventory(tmp_path / "hosts")
        r = _cli(*args)
        assert "Traceback" not in r.output and "MarkupError" not in r.output, r.output
        text = r.stdout + r.stderr
        assert "\x1b" not in text and "\\x1b" in text and "\\x0a" in text, text
        assert not any(line.startswith("error: forged") for line in text.splitlines()), text
        if "esc2" not in args:
            # Read whole (no error line); compared with the shipped family's files the host is
            # not fine (its own series is the tests'), and the exit code says so.
            assert r.exit_code == 1 and "error:" not in r.stderr, r.output
            assert r.stdout.splitlines()[-1].startswith("esc: needs attention: "), r.stdout
            assert "fam[/]ily" in r.stdout and "[prod]" in r.stdout and "[bold]b[/bold]" in r.stdout, r.stdout


# ---------------------------------------------------------------- item 8: slow, silent, flooding hosts


def _program_host(sshd, tmp_path, name, program: str, **keys):
    """A host whose 'interpreter' is ``program`` (a host-side misbehaviour)."""
    wrapper = tmp_path / f"{name}-python"
    wrapper.write_text(f"#!{sys.executable}\n{program}\n")
    wrapper.chmod(0o755)
    from ddtree_deploy.sandbox import SandboxHost as TestHost

    h = TestHost(name, sshd, wrapper, tmp_path, tmp_path / f"{name}-state")
    return load_host(str(h.inventory(tmp_path / f"inv-{name}", **keys)))


def test_a_silent_host_fails_after_op_timeout_naming_host_and_step(sshd, tmp_path, env, monkeypatch):
    host = _program_host(sshd, tmp_path, "silent", "import time; time.sleep(600)", op_timeout=2)
    t0 = time.monotonic()
    with pytest.raises(DeployError) as e:
        host_status.status(host, SSHTransport(host))
    took = time.monotonic() - t0
    assert e.value.code == "timeout" and "silent" in e.value.message and "during init" in e.value.message
    assert took < 20, took
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "inv-silent"))
    r = _cli("status", "--host", "silent")
    assert r.exit_code == 1 and "no answer from the host agent during init after 2 s" in r.stderr, r.output


FLOOD = """import sys
b = sys.stdin.buffer
b.read(int(b.readline()))
out = sys.stdout.buffer
n = int(sys.argv[-1]) if sys.argv[-1].isdigit() else 0
"""


def test_replies_are_bounded_and_read_in_linear_time(sshd, tmp_path, env):
    from ddtree_deploy.hostprog.protocol import PROTOCOL
    from ddtree_deploy.remote.link import ReplyError

    big = _program_host(sshd, tmp_path, "big", FLOOD + """
out.write(b'{"ok": true, "protocol": %d, "pad": "' + b"a" * (32 << 20) + b'"}\\n'); out.flush(); b.read()
""" % PROTOCOL, op_timeout=60)
    t0 = time.monotonic()
    with SSHTransport(big) as t, AgentSession(t, big) as sess:
        reply = sess.one({"op": "init"})
        # SSH keepalives on the connection: a vanished host fails the read, never hangs it.
        assert t.conn.transport.packetizer._Packetizer__keepalive_interval == 15
    took = time.monotonic() - t0
    assert reply["ok"] and len(reply["pad"]) == 32 << 20
    print(f"\n32 MiB agent reply read in {took:.2f} s")
    flood = _program_host(sshd, tmp_path, "flood", FLOOD + """
chunk = b"x" * (1 << 20)
for _ in range(80):
    out.write(chunk)
out.flush(); b.read()
""", op_timeout=60)
    with pytest.raises(ReplyError) as e:
        with SSHTransport(flood) as t, AgentSession(t, flood) as sess:
            sess.one({"op": "init"})
    assert "over 64 MiB" in e.value.message and "flood" in e.value.message


# ---------------------------------------------------------------- item 9


def test_status_reports_a_symlinked_target_instead_of_giving_up(sshd, tmp_path, env, series):
    h, host = new_host(sshd, tmp_path)
    real = tmp_path / "real_utils.py"
    real.write_bytes(h.read(UTILS))
    h.file(UTILS).unlink()
    h.file(UTILS).symlink_to(real)
    with host_status.reading(host, SSHTransport(host), TARGETS) as read:
        pass
    doc = host_status.describe(host.name, read.facts, desired_for(series, host.name, read.facts))
    states = {f["path"]: f for f in doc["files"]}
    assert states[UTILS]["state"] == "unsafe" and "symlink" in states[UTILS]["detail"]
    assert states[SPEC]["state"] == "pristine"
    with pytest.raises(DeployError) as e:
        push(host, series)
    assert e.value.code == "unsafe-file" and real.read_bytes() == h.read(UTILS)


def test_snapshot_pull_stores_only_the_files_it_asked_for(sshd, tmp_path, env, monkeypatch):
    """A host whose agent answers one file more than asked (the host's interpreter runs our
    agent, then adds a file to its facts: the Facts part's op): nothing is stored."""
    h = sshd.add_host("extra", tmp_path / "extra", files=[SPEC, UTILS])
    patched_agent = tmp_path / "extra-python"
    patched_agent.write_text(f"""#!{h.python}
import sys
b = sys.stdin.buffer
g = {{'__name__': 'ddtree_agent'}}
exec(compile(b.read(int(b.readline())), 'ddtree_agent.py', 'exec'), g)
orig = g['Facts'].op_facts
def facts(self, request):
    out = orig(self, request)
    out['files']['sglang/evil.py'] = {{'sha256': '0' * 64, 'size': 1, 'mode': 420, 'uid': 0, 'gid': 0,
                                       'data': 'eA=='}}
    return out
g['Facts'].op_facts = facts
g['main']()
""")
    patched_agent.chmod(0o755)
    h.python = patched_agent
    h.inventory(tmp_path / "hosts")
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    r = _cli("snapshot", "pull", "--host", "extra", "--family", str(FAMILY))
    assert r.exit_code == 1 and "other files than asked" in r.stderr, r.output
    assert not list((tmp_path / "snapshot").rglob("evil.py"))


# ---------------------------------------------------------------- item 7


def test_a_family_named_by_the_host_is_only_looked_up_among_known_families(sshd, tmp_path, env, series):
    """The journal names an absolute folder (with a family in it): the smoke must not load it."""
    from ddtree_deploy.fleets import rollout

    h, host = new_host(sshd, tmp_path)
    push(host, series)
    planted = tmp_path / "planted"
    shutil.copytree(FAMILY.parent.parent, planted)  # a complete, loadable family outside patches/
    doc = journal(h)
    doc["series"] = str(planted / "patches" / FAMILY.name)
    (h.state_dir / "journal.json").write_text(json.dumps(doc))
    with pytest.raises(DeployError) as e:
        rollout.smoke_host(host, lambda: SSHTransport(host), levels=["compile"], patches_dir=FAMILY.parent)
    assert e.value.code == "unknown-family" and "no such family" in e.value.message


# ---------------------------------------------------------------- item 9: a cut during the upload


def test_a_cut_during_the_upload_is_one_connection_error_line(sshd, tmp_path, env, monkeypatch, series):
    """The CLI, cut by a TCP proxy at offsets across the agent's upload and the requests:
    exit 1, one `error:` line naming the host, never a traceback (EOFError or other)."""
    from link_faults import CutProxy

    h, _host = new_host(sshd, tmp_path)
    proxy = CutProxy(sshd.port)
    sshd.trust(port=proxy.port)
    h.inventory(tmp_path / "hosts", port=proxy.port)
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path / "hosts"))
    args = ["push", "--host", "h", "--family", str(FAMILY), "--no-smoke"]
    try:
        proxy.arm(None)
        assert _cli(*args).exit_code == 0
        total = proxy.relayed
        assert _cli("rollback", "--host", "h").exit_code == 0
        seen = 0
        for cut in range(4000, total, max(1, (total - 4000) // 12)):
            proxy.arm(cut)
            r = _cli(*args)
            if not proxy.cut:
                continue
            seen += 1
            assert r.exit_code == 1, (cut, r.output)
            assert "Traceback" not in r.output and "EOFError" not in r.output, (cut, r.output)
            errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
            assert len(errors) == 1 and "h:" in errors[0], (cut, r.stderr)
            deadline = time.monotonic() + 15
            while (h.state_dir / "lock").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            proxy.arm(None)
            _cli("rollback", "--host", "h")
        assert seen >= 8
        # Densely across status's whole conversation (the agent upload is most of it): a
        # cut there once ended in paramiko's EOFError escaping the channel's close.
        proxy.arm(None)
        # (with the family pushed: against another family's files the host would not be fine)
        status = ("status", "--host", "h", "--family", str(FAMILY))
        assert _cli(*status).exit_code == 0
        total, dense = proxy.relayed, 0
        # 40 cuts spread over the upload of the agent's bundle (the same kind of bytes all
        # along: over 100 KB since the programs ship with their modules), then every 500 bytes
        # over the last 20 KB: the requests, the replies and the channel's goodbye.
        tail = max(3000, total - 20_000)
        cuts = sorted({*range(3000, tail, max(500, (tail - 3000) // 40)), *range(tail, total, 500)})
        for cut in cuts:
            proxy.arm(cut)
            r = _cli(*status)
            if not proxy.cut:
                continue
            dense += 1
            assert "Traceback" not in r.output and "EOFError" not in r.output, (cut, r.output)
            if r.exit_code == 0:  # cut after the last reply (the channel's goodbye): status was read
                assert "lock:" in r.stdout, (cut, r.output)
                continue
            assert r.exit_code == 1, (cut, r.output)
            assert len([line for line in r.stderr.splitlines() if line.startswith("error:")]) == 1, r.stderr
        assert dense >= 40
    finally:
        proxy.close()
