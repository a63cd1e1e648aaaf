"""The host agent, run for real as a subprocess of a real venv holding SGLang 0.5.12.post1 files.

No SSH here (tests/e2e/test_push.py does that): LocalTransport runs the very program the SSH
transport ships, so the host-side logic (lock, back up, stage, switch, journal, purge)
is tested directly, including its test hooks that kill it at a step.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ddtree_deploy.base.digests import sha256
from ddtree_deploy.hostprog.fileops import TMP_TAG
from ddtree_deploy.hostprog.wire import boot_id, process_start
from ddtree_deploy.remote.agent_session import AgentSession
from ddtree_deploy.remote.local import LocalTransport
from ddtree_deploy.remote.program import agent_argv, agent_source
from ddtree_deploy.session.decide import apply_push_request
from ddtree_deploy.session.plan import Desired, Target, plan_push
from ddtree_deploy.settings.inventory import Host

from ddtree_deploy.sandbox import make_python_env  # noqa: E402

SPEC = "sglang/srt/speculative/spec_info.py"
UTILS = "sglang/srt/speculative/dflash_utils.py"
NEW = "sglang/srt/speculative/ddtree_agent_test.py"


@pytest.fixture(scope="module")
def pristine_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent-env")
    python, site = make_python_env(root / "env", [SPEC, UTILS])
    return python, site


@pytest.fixture
def env(pristine_env, tmp_path, monkeypatch):
    """A fresh copy of the package files per test, found first through PYTHONPATH."""
    python, site = pristine_env
    root = tmp_path / "site"
    for src in (site / "sglang", *site.glob("sglang-*.dist-info")):
        shutil.copytree(src, root / src.name, symlinks=True)
    monkeypatch.setenv("PYTHONPATH", str(root))  # the agent subprocess inherits it
    return Host(name="t", python=str(python), ssh=None, state_dir=str(tmp_path / "state")), root


def session(h: Host) -> AgentSession:
    return AgentSession(LocalTransport(), h)


def opened(sess: AgentSession, h: Host, *, lock=True, run_id="run-a", paths=(SPEC, UTILS, NEW), hooks=None):
    reqs = [{"op": "init", "state_dir": h.state_dir, "hooks": hooks or {}}]
    if lock:
        reqs.append({"op": "lock", "run_id": run_id, "holder": "tester@here", "command": "push"})
    reqs.append({"op": "facts", "paths": list(paths)})
    return sess.call(*reqs)


def desired(root: Path) -> Desired:
    targets = []
    for rel in (SPEC, UTILS):
        data = (root / rel).read_bytes()
        patched = data + b"\n# patched by the agent test\n"
        targets.append(Target(rel, sha256(data), sha256(patched), patched))
    added = b"ADDED = True\n"
    targets.append(Target(NEW, None, sha256(added), added))
    return Desired("test", "id0", "0.5.12.post1", "test", tuple(targets))


def push_request(h: Host, root: Path, facts: dict, run_id="run-a", want=None) -> tuple[dict, Desired]:
    want = want or desired(root)
    current = {p: (i or {}).get("sha256") for p, i in facts["files"].items()}
    plan = plan_push(h.name, want, current)
    return apply_push_request(h, run_id, want, plan), want


def test_argv_and_source_are_what_runs(env):
    h, _root = env
    assert agent_argv(h)[:2] == [h.python, "-c"]
    assert b"def serve(" in agent_source() and b"import " in agent_source()


def test_facts_find_sglang_without_importing_it(env):
    h, root = env
    with session(h) as sess:
        init, facts = opened(sess, h, lock=False)
    assert init["ok"] and facts["ok"], facts
    assert facts["sglang_version"] == "0.5.12.post1" and facts["version_source"] == "metadata"
    assert Path(facts["package_root"]) == root
    assert facts["files"][SPEC]["sha256"] == hashlib.sha256((root / SPEC).read_bytes()).hexdigest()
    assert facts["files"][NEW] is None
    assert facts["journal"] is None and facts["backups"] == [] and facts["lock"] is None


@pytest.mark.parametrize("bad", ["../x.py", "/etc/passwd", "sglang/../../x.py", "sglang//x.py", "sglang/./x.py"])
def test_paths_outside_the_package_are_refused(env, bad):
    h, _root = env
    with session(h) as sess:
        _init, facts = opened(sess, h, lock=False, paths=[bad])
    assert not facts["ok"] and facts["code"] == "bad-path", facts


def test_symlink_escape_is_refused(env, tmp_path):
    h, root = env
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / "sglang" / "srt" / "escape").symlink_to(outside)
    with session(h) as sess:
        _init, facts = opened(sess, h, lock=False, paths=["sglang/srt/escape/x.py", SPEC])
    # Reported per file (status explains it), never read through the link; other files still read.
    assert facts["ok"] and "symlink" in facts["files"]["sglang/srt/escape/x.py"]["unsafe"], facts
    assert facts["files"][SPEC]["sha256"]
    with session(h) as sess:
        _i, _l, facts = opened(sess, h, paths=[SPEC])
        data = b"X = 1\n"
        reply = sess.one({"op": "apply", "kind": "push", "run_id": "run-a", "make_backup": False,
                          "final_phase": "deployed", "journal": {},
                          "files": [{"path": "sglang/srt/escape/x.py", "expect": None, "want": sha256(data),
                                     "data": base64.b64encode(data).decode()}]})
    assert not reply["ok"] and reply["code"] == "unsafe-file" and "symlink" in reply["message"]
    assert list(outside.iterdir()) == []


def test_lock_refuses_a_second_holder_and_is_released_at_eof(env):
    h, _root = env
    with session(h) as a:
        _i, lock_a, _f = opened(a, h, run_id="run-a")
        assert lock_a["ok"] and lock_a["broke"] is None
        with session(h) as b:
            _i, lock_b, facts_b = opened(b, h, run_id="run-b")
            assert not lock_b["ok"] and lock_b["code"] == "locked" and lock_b["stale"] is False
            assert lock_b["holder"]["run_id"] == "run-a" and lock_b["holder"]["holder"] == "tester@here"
            assert lock_b["holder"]["time"].endswith("Z")
            assert facts_b["lock"]["run_id"] == "run-a"
            # Without the lock, the mutating op is refused outright.
            refused = b.one({"op": "apply", "kind": "push", "run_id": "run-b", "files": [], "journal": {},
                               "final_phase": "deployed"})
            assert not refused["ok"] and refused["code"] == "protocol"
    # a's stdin closed: the agent released the lock on its way out.
    with session(h) as c:
        _i, lock_c, _f = opened(c, h, run_id="run-c")
        assert lock_c["ok"] and lock_c["broke"] is None


def _fake_lock(state: Path, **owner) -> None:
    (state / "lock").mkdir(parents=True)
    base = {"run_id": "old-run", "holder": "ghost@elsewhere", "command": "push", "time": "2026-01-01T00:00:00Z",
            "host": socket.gethostname(), "boot_id": boot_id()}
    (state / "lock" / "owner.json").write_text(json.dumps({**base, **owner}))


def test_lock_of_a_dead_process_is_taken_over(env):
    h, _root = env
    dead = subprocess.Popen(["true"])
    dead.wait()
    _fake_lock(Path(h.state_dir), pid=dead.pid, pid_start="1")
    with session(h) as sess:
        _i, lock, _f = opened(sess, h)
    assert lock["ok"] and lock["broke"]["run_id"] == "old-run" and lock["broke"]["stale"] is True


def test_lock_of_a_live_process_needs_break_lock(env):
    h, _root = env
    _fake_lock(Path(h.state_dir), pid=os.getpid(), pid_start=process_start(os.getpid()))
    with session(h) as sess:
        _i, lock, _f = opened(sess, h)
    assert not lock["ok"] and lock["stale"] is False and lock["holder"]["holder"] == "ghost@elsewhere"
    with session(h) as sess:
        init, lock = sess.call({"op": "init", "state_dir": h.state_dir},
                               {"op": "lock", "run_id": "r2", "holder": "me", "break_lock": True})
    assert lock["ok"] and lock["broke"]["run_id"] == "old-run" and lock["broke"]["stale"] is False


def test_truncated_request_changes_nothing_and_releases_the_lock(env):
    h, root = env
    before = {p: (root / p).read_bytes() for p in (SPEC, UTILS)}
    with session(h) as sess:
        _i, _l, facts = opened(sess, h)
        request, _want = push_request(h, root, facts)
        line = json.dumps(request).encode()
        sess.proc.write(line[: len(line) // 2])  # the connection "drops" mid-request
    assert {p: (root / p).read_bytes() for p in (SPEC, UTILS)} == before
    assert not (root / NEW).exists()
    state = Path(h.state_dir)
    assert not (state / "lock").exists() and not (state / "journal.json").exists()
    assert not (state / "backups").exists()


def test_apply_rechecks_hashes_under_the_lock(env):
    h, root = env
    with session(h) as sess:
        _i, _l, facts = opened(sess, h)
        request, _want = push_request(h, root, facts)
        (root / UTILS).write_bytes(b"# edited by someone between discover and apply\n")
        reply = sess.one(request)
    assert not reply["ok"] and reply["code"] == "changed" and UTILS in reply["message"]
    assert not (Path(h.state_dir) / "journal.json").exists() and not (root / NEW).exists()


def test_apply_backs_up_switches_keeps_owner_mode_and_purges_bytecode(env):
    h, root = env
    spec = root / SPEC
    os.chown(spec, 1234, 5678)
    os.chmod(spec, 0o640)
    cache = spec.parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    stale = [cache / "spec_info.cpython-311.pyc", cache / "spec_info.cpython-311.opt-1.pyc"]
    other = cache / "spec_registry.cpython-311.pyc"
    for p in (*stale, other):
        p.write_bytes(b"stale bytecode")
    originals = {p: (root / p).read_bytes() for p in (SPEC, UTILS)}
    with session(h) as sess:
        _i, _l, facts = opened(sess, h)
        request, want = push_request(h, root, facts)
        reply = sess.one(request)
    assert reply["ok"], reply
    for t in want.targets:
        assert (root / t.path).read_bytes() == t.data
    st = spec.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (1234, 5678, 0o640)
    assert ((root / NEW).stat().st_mode & 0o7777) == 0o644
    assert not any(p.exists() for p in stale) and other.exists()
    assert sorted(reply["purged"]) == sorted(str(p) for p in stale)
    state = Path(h.state_dir)
    journal = json.loads((state / "journal.json").read_text())
    assert journal["phase"] == "deployed" and journal["op"] == "push" and journal["backup_id"] == reply["backup_id"]
    manifest = json.loads((state / "backups" / reply["backup_id"] / "manifest.json").read_text())
    for rel, data in originals.items():
        entry = manifest["files"][rel]
        assert entry["sha256"] == sha256(data)
        assert (state / "backups" / reply["backup_id"] / entry["blob"]).read_bytes() == data
    assert manifest["files"][NEW] == {"sha256": None, "blob": None}
    assert manifest["files"][SPEC]["mode"] == 0o640
    assert not (state / "staging").exists() or not any((state / "staging").iterdir())
    assert not [p for p in spec.parent.iterdir() if TMP_TAG in p.name]


def test_staged_files_are_private_whatever_the_umask(env):
    h, root = env
    old = os.umask(0)
    try:
        with session(h) as sess:  # the agent inherits umask 0
            _i, _l, facts = opened(sess, h, hooks={"exit_after_staging": True})
            request, _want = push_request(h, root, facts)
            with pytest.raises(Exception, match="agent stopped during apply"):
                sess.one(request)
    finally:
        os.umask(old)
    state = Path(h.state_dir)
    staged = list((state / "staging").rglob("*"))
    assert staged, "the hook stops after staging: the staged files are still there"
    for p in staged:
        assert (p.stat().st_mode & 0o777) == (0o700 if p.is_dir() else 0o600), p
    assert (state.stat().st_mode & 0o777) == 0o700
    for p in (state / "backups").rglob("*"):
        assert (p.stat().st_mode & 0o777) == (0o700 if p.is_dir() else 0o600), p
    assert json.loads((state / "journal.json").read_text())["phase"] == "staged"


def test_killed_mid_switch_then_rerun_completes_from_older_backup(env):
    h, root = env
    originals = {p: (root / p).read_bytes() for p in (SPEC, UTILS)}
    with session(h) as sess:
        _i, _l, facts = opened(sess, h, hooks={"exit_after_renames": 1})
        request, want = push_request(h, root, facts)
        with pytest.raises(Exception, match="agent stopped during apply"):
            sess.one(request)
    by_path = {t.path: t for t in want.targets}
    # Exactly one file switched; each file wholly old or wholly new.
    changed = [t.path for t in want.targets if (root / t.path).exists() and (root / t.path).read_bytes() == t.data]
    assert len(changed) == 1
    for rel, data in originals.items():
        assert (root / rel).read_bytes() in (data, by_path[rel].data)
    state = Path(h.state_dir)
    assert json.loads((state / "journal.json").read_text())["phase"] == "switching"
    assert (state / "lock").exists()  # the killed agent could not release it...
    with session(h) as sess:
        _i, lock, facts = opened(sess, h, run_id="run-b")
        assert lock["ok"] and lock["broke"]["stale"] is True  # ...and it is provably stale
        request, want = push_request(h, root, facts, run_id="run-b", want=want)
        reply = sess.one(request)
    assert reply["ok"], reply
    for t in want.targets:
        assert (root / t.path).read_bytes() == t.data
    # The new backup holds the *pristine* version of the already-switched file (from the older backup).
    manifest = json.loads((state / "backups" / reply["backup_id"] / "manifest.json").read_text())
    for rel, data in originals.items():
        blob = state / "backups" / reply["backup_id"] / manifest["files"][rel]["blob"]
        assert blob.read_bytes() == data


def test_preflight_refuses_before_any_write(env):
    h, root = env
    before = (root / SPEC).read_bytes()
    with session(h) as sess:
        _i, _l, facts = opened(sess, h, paths=(SPEC, "sglang/srt/no_such_folder/x.py"))
        data = b"X = 1\n"
        reply = sess.one({
            "op": "apply", "kind": "push", "run_id": "run-a", "make_backup": True, "final_phase": "deployed",
            "journal": {}, "backup": [{"path": SPEC, "pristine": facts["files"][SPEC]["sha256"]}],
            "files": [
                {"path": SPEC, "expect": facts["files"][SPEC]["sha256"], "want": sha256(data),
                 "data": base64.b64encode(data).decode()},
                {"path": "sglang/srt/no_such_folder/x.py", "expect": None, "want": sha256(data),
                 "data": base64.b64encode(data).decode()},
            ],
        })
    assert not reply["ok"] and reply["code"] == "preflight" and "no_such_folder" in reply["message"]
    assert (root / SPEC).read_bytes() == before
    state = Path(h.state_dir)
    assert not (state / "backups").exists() and not (state / "journal.json").exists()


def test_agent_runs_on_python_3_8(env):
    """Hosts may have an old interpreter: the whole push path runs under Python 3.8."""
    from ddtree_testkit.system_tools import python_3_8

    old = python_3_8()
    if old is None:  # none is installed by the project: the agent's 3.8 syntax is still checked below
        pytest.skip("no Python 3.8 interpreter on this machine (the agent's syntax is still checked below)")
    h, root = env
    h = Host(name="old", python=old, ssh=None, state_dir=h.state_dir)
    with session(h) as sess:
        init, _lock, facts = opened(sess, h)
        assert init["python"].startswith("3.8.") and facts["ok"], facts
        request, want = push_request(h, root, facts)
        reply = sess.one(request)
    assert reply["ok"], reply
    for t in want.targets:
        assert (root / t.path).read_bytes() == t.data


def test_agent_source_is_python_3_8_syntax():
    import ast

    ast.parse(agent_source().decode(), feature_version=(3, 8))


def test_mark_moves_switched_to_deployed_only_for_its_run(env):
    """`mark` is a compare-and-set on run id and phase, under the deploy lock."""
    h, root = env
    with session(h) as sess:
        _i, _l, facts = opened(sess, h)
        request, _want = push_request(h, root, facts)
        request["final_phase"] = "switched"
        assert sess.one(request)["ok"]
        mark = {"op": "mark", "run_id": "run-a", "expect": "switched", "phase": "deployed"}
        stale = sess.one(dict(mark, run_id="run-old"))
        assert not stale["ok"] and stale["code"] == "changed"
        assert "at phase switched of run run-a, not switched of run run-old" in stale["message"]
        failed = sess.one(dict(mark, phase="switched", smoke={"failed": "import"}))
        assert failed["ok"] and failed["journal"]["smoke"] == {"failed": "import"}
        assert sess.one(mark)["ok"]
        assert sess.one(mark).get("already") is True  # a rerun after a lost reply: no change
        sess.one({"op": "unlock"})
        refused = sess.one(mark)  # without the lock: refused
    assert not refused["ok"] and refused["code"] == "protocol"
    journal = json.loads((Path(h.state_dir) / "journal.json").read_text())
    assert journal["phase"] == "deployed" and journal["run_id"] == "run-a"


def test_a_running_tune_refuses_the_deploy_lock_and_a_dead_one_does_not(env):
    """A tune's servers run the files a push would switch: while its lock's process lives,
    the deploy lock is refused (and not left held); once that process is gone, it is ignored."""
    h, _root = env
    with session(h) as sess:  # creates the (marked) state dir
        assert opened(sess, h)[1]["ok"]
    tune = Path(h.state_dir) / "tune" / "lock"
    tune.mkdir(parents=True)
    owner = {"run_id": "tune-1", "holder": "tuner@here", "command": "tune", "host": socket.gethostname(),
             "pid": os.getpid(), "pid_start": process_start(os.getpid())}
    (tune / "owner.json").write_text(json.dumps(owner))
    with session(h) as sess:
        _i, lock, _f = opened(sess, h, run_id="run-b")
    assert not lock["ok"] and "tune is running" in lock["message"] and lock["holder"]["run_id"] == "tune-1"
    assert not (Path(h.state_dir) / "lock").exists()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tune / "owner.json").write_text(json.dumps({**owner, "pid": dead.pid}))
    with session(h) as sess:
        _i, lock, _f = opened(sess, h, run_id="run-c")
    assert lock["ok"]


def test_the_client_names_a_running_tune_not_a_deploy_lock():
    from ddtree_deploy.session.push import _locked_error

    host = Host(name="gpu1", python="/usr/bin/python3", ssh=None, state_dir="/tmp/s")
    err = _locked_error(host, {"ok": False, "code": "locked", "holder": {
        "command": "tune", "run_id": "t1", "holder": "ann@ops", "time": "2026-11-30T10:00:00Z", "pid": 42}})
    assert err.code == "locked" and err.message.startswith("gpu1: a tune is running (run t1 by ann@ops")
    assert "tune" in err.hint and "--break-lock" not in err.hint


def test_every_host_program_runs_shipped_whole_with_the_stdlib_alone(tmp_path):
    """The deploy agent, the smoke program and the tune program (with the smoke program
    shipped ahead of it as a module) start through the one ProgramSession and run on an
    interpreter that sees the standard library only (-I -S: no site-packages, no
    PYTHONPATH, so no ddtree_deploy to fall back on)."""
    import sys
    import time

    from ddtree_deploy.remote.program import AGENT, ProgramSession
    from ddtree_deploy.smoke.run import SMOKE_PROGRAM
    from ddtree_deploy.tuning.run import TUNE_PROGRAM

    bare = tmp_path / "python"
    bare.write_text(f'#!/bin/sh\nexec "{sys.executable}" -I -S "$@"\n')
    bare.chmod(0o755)
    host = Host(name="bare", python=str(bare), ssh=None, state_dir=str(tmp_path / "state"))
    good = tmp_path / "good.py"
    good.write_text("x = 1\n")
    cases = [
        (AGENT, {"op": "init", "state_dir": str(tmp_path / "state")}, lambda doc: doc.get("ok") and "python" in doc),
        (SMOKE_PROGRAM, {"levels": ["compile"], "compile": {"files": [str(good)]}},
         lambda doc: doc.get("event") == "start"),
        (TUNE_PROGRAM, {"op": "end"}, lambda doc: doc.get("event") == "bye"),
    ]
    for program, request, expected in cases:
        with ProgramSession(LocalTransport(), host, program) as sess:
            sess.send(request)
            doc = sess.read(time.monotonic() + 30, "its first line")
        assert expected(doc), (program.file, doc)
