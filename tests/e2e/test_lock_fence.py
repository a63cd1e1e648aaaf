"""The deploy lock is a fencing token (issue #22): a run whose lock was taken by
`lock release --force` never writes again, and `status` never calls a mixed host `deployed`.

Two real controllers (the console script, each its own process and SSH connection) against
one real sshd on loopback and real SGLang files (tests/sshd_host.py), and a real
`lock release --force` between them. The first run's host agent stops itself (SIGSTOP, the
test hook ``stop_after_renames`` / ``stop_before_apply``) at a named point of its switch;
the lock is released by force; a second run does (or does not do) its work; then the first
agent is continued (SIGCONT). In every trial:

* every target file is wholly pristine or wholly patched, and never pristine under a
  `deployed` journal (the testers saw 7/1 and 5/3 under `deployed`);
* `status` is true: each file's state is what its bytes are, and `mixed` (MIXED in the
  text) exactly when the files contradict the journal;
* the forced-out run exits 1 with code `lost-lock` and a message that says what it did.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envelope_check import check_envelope  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, cli, ok  # noqa: E402

pytestmark = pytest.mark.sshd
CONSOLE = Path(sys.executable).parent / "ddtree-deploy"
TARGETS = (SPEC, UTILS, ADDED)


def start_controller(h, command: str, hooks: dict) -> subprocess.Popen:
    """A second controller process: the console script, its agent stopping at ``hooks``."""
    env = dict(os.environ, DDTREE_DEPLOY_TEST_HOOKS=json.dumps(hooks))
    return subprocess.Popen([str(CONSOLE), command, "--host", h.name, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def stopped_agent(h, proc: subprocess.Popen, deadline_s: float = 60.0) -> int:
    """The pid of the lock holder's agent once it has stopped itself (state T)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        try:
            pid = json.loads((h.state_dir / "lock" / "owner.json").read_text())["pid"]
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T":
                return pid
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.05)
    raise AssertionError("the agent never stopped at its hook")


def finish(proc: subprocess.Popen, command: str) -> dict:
    out, err = proc.communicate(timeout=120)
    return {"code": proc.returncode, "doc": check_envelope(out, proc.returncode, command), "stderr": err}


def files_now(h) -> dict:
    return {p: h.read(p) for p in TARGETS}


def check_status_is_true(h, oracle) -> dict:
    """Every file wholly one version; status says which, and calls the host MIXED exactly
    when its files contradict the journal (never `deployed` over a pristine file)."""
    pristine, patched = oracle
    actual = {}
    for path, data in files_now(h).items():
        assert data in (pristine[path], patched[path]), f"{path} is neither pristine nor patched"
        actual[path] = "patched" if data == patched[path] else "pristine"
    read = cli("status", "--host", h.name, "--json")
    doc = json.loads(read.stdout)["hosts"][0]
    states = {f["path"]: f["state"] for f in doc["files"]}
    assert states == actual, (states, actual)
    contradicts = (doc["phase"] in ("deployed", "switched") and "pristine" in actual.values()
                   or doc["phase"] == "rolled-back" and "patched" in actual.values())
    assert doc["mixed"] is contradicts, doc
    # A host that answered is fine only when nothing needs a person: exit 1 otherwise.
    assert read.exit_code == (1 if doc["attention"] else 0), read.output
    assert ("mixed" in [a["kind"] for a in doc["attention"]]) is contradicts, doc["attention"]
    if contradicts:
        assert doc["explanation"].startswith("MIXED: the journal says"), doc["explanation"]
        text = cli("status", "--host", h.name).stdout
        assert f"phase: MIXED (journal: {doc['phase']})" in text
        assert text.splitlines()[-1].startswith(f"{h.name}: needs attention: MIXED: "), text
    return doc


# (the first run, where its agent stops, what happens while it is stopped, the first run's
#  end as its message says it, the host's end)
TRIALS = {
    # A push stopped after 1 of 3 renames; a second push completes it; A resumes: it writes
    # nothing (the journal is B's now) and says so.
    "push-1-then-push": ("push", {"stop_after_renames": 1}, "push", "the host changed since", "deployed"),
    # After 2 renames; a rollback runs meanwhile: it restores the backup A made.
    "push-2-then-rollback": ("push", {"stop_after_renames": 2}, "rollback", "the host changed since", "rolled-back"),
    # Nobody takes the lock: A resumes, finds it gone and nobody written since: it switches
    # back the file it switched and restores the journal.
    "push-1-alone": ("push", {"stop_after_renames": 1}, None, "were switched back", None),
    # A second push holds the lock (its own agent stopped before its apply) when A resumes:
    # A writes nothing; then B completes.
    "push-2-while-held": ("push", {"stop_after_renames": 2}, "held", "holds it now", "deployed"),
    # Stopped before its apply: lost before anything was written.
    "push-before-apply": ("push", {"stop_before_apply": True}, "push", "nothing on the host was changed", "deployed"),
    # A rollback stopped mid-switch, a push meanwhile.
    "rollback-1-then-push": ("rollback", {"stop_after_renames": 1}, "push", "the host changed since", "deployed"),
}


@pytest.mark.parametrize("trial", list(TRIALS))
def test_a_forced_release_never_mixes_the_host(host, oracle, trial):
    first, hooks, second, said, phase = TRIALS[trial]
    pristine, patched = oracle
    if first == "rollback":
        ok("push", "--host", host.name)  # something to roll back
    before = files_now(host)
    a = start_controller(host, first, hooks)
    a_agent = stopped_agent(host, a)
    released = ok("lock", "release", "--host", host.name, "--force")
    assert "released the lock of run" in released.stdout
    b_agent = None
    try:
        if second == "held":
            b = start_controller(host, "push", {"stop_before_apply": True})
            b_agent = stopped_agent(host, b)
        elif second is not None:
            ok(second, "--host", host.name)
        os.kill(a_agent, signal.SIGCONT)
        a_end = finish(a, first)
        if b_agent is not None:
            check_status_is_true(host, oracle)  # while B holds the lock and A has given up
            os.kill(b_agent, signal.SIGCONT)
            b_end = finish(b, "push")
            assert b_end["code"] == 0, b_end["stderr"]
    finally:
        for pid in (a_agent, b_agent):
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
    error = a_end["doc"]["error"]
    assert a_end["code"] == 1 and error["code"] == "lost-lock", a_end
    assert said in error["message"] and "lost the deploy lock before" in error["message"], error["message"]
    assert "released by force by" in error["message"], error["message"]
    assert "Traceback" not in a_end["stderr"]
    doc = check_status_is_true(host, oracle)
    if phase is None:  # nobody else wrote: the first run undid its own switch
        assert files_now(host) == before and not doc["mixed"]
        assert a_end["doc"]["hosts"][0]["outcome"] == "failed, host unchanged"
    else:
        assert doc["phase"] == phase and not doc["mixed"]
        assert files_now(host) == (patched if phase == "deployed" else pristine)
    assert not (host.state_dir / "lock").exists()
    # Nothing of either run is left behind: no temp copy, no kept previous version, no staging.
    from sshd_host import temp_files

    assert temp_files(host.site / "sglang", host.state_dir) == []
    assert not (host.state_dir / "staging").exists() or not any((host.state_dir / "staging").iterdir())


def test_status_calls_a_host_whose_files_contradict_its_journal_mixed(host, oracle):
    """The state the testers saw: the journal says deployed, some files are pristine (an added
    module absent). status: MIXED, with the way on; push completes it."""
    pristine, _patched = oracle
    ok("push", "--host", host.name)
    host.file(ADDED).unlink()  # the added module gone: pristine for a file the series adds
    host.file(SPEC).write_bytes(pristine[SPEC])
    read = cli("status", "--host", host.name, "--json")
    assert read.exit_code == 1, read.output  # a host that answered is not a host that is fine
    doc = json.loads(read.stdout)["hosts"][0]
    assert doc["phase"] == "deployed" and doc["mixed"] is True and doc["outcome"] == "needs attention"
    assert [a["kind"] for a in doc["attention"]] == ["mixed"]
    assert doc["explanation"].startswith("MIXED: the journal says deployed (push run ")
    assert "2 of its file(s) are pristine (not patched)" in doc["explanation"]
    assert f"ddtree-deploy push --host {host.name}" in doc["explanation"]
    text = cli("status", "--host", host.name).stdout
    assert "phase: MIXED (journal: deployed)" in text and "phase: deployed:" not in text
    ok("push", "--host", host.name)
    assert json.loads(ok("status", "--host", host.name, "--json").stdout)["hosts"][0]["mixed"] is False


# ---------------------------------------------------------------- the agent in-process, on a real folder


def _agents(tmp_path):
    from ddtree_deploy.hostprog.agent import Agent

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    out = []
    for _ in range(2):
        a = Agent(str(tmp_path / "state"))
        a.package.root = str(site)
        out.append(a)
    return out


def test_a_released_run_neither_writes_nor_removes_the_new_holders_lock(tmp_path):
    a, b = _agents(tmp_path)
    assert a.handle({"op": "lock", "run_id": "ra", "holder": "alice@c1"})["ok"]
    a.journal.write({"version": 1, "run_id": "ra", "op": "push"}, "staged")
    released = b.handle({"op": "lock_release", "force": True, "holder": "bob@c2"})
    assert released["ok"] and released["lock"]["run_id"] == "ra"
    assert b.handle({"op": "lock", "run_id": "rb", "holder": "bob@c2"})["ok"]
    with pytest.raises(Exception) as lost:
        a.journal.write({"version": 1, "run_id": "ra", "op": "push"}, "switching")
    assert getattr(lost.value, "code", None) == "lost-lock"
    assert json.loads((tmp_path / "state" / "journal.json").read_text())["phase"] == "staged"
    mark = a.handle({"op": "mark", "run_id": "ra", "expect": "staged", "phase": "switched"})
    assert mark["code"] == "lost-lock" and "released by force by bob@c2" in mark["message"], mark
    assert "run rb (bob@c2, None) holds it since" in mark["message"] and mark["unchanged"] is True
    a.lock.release()  # at its EOF: never somebody else's lock
    assert json.loads((tmp_path / "state" / "lock" / "owner.json").read_text())["run_id"] == "rb"
    b.lock.release()
    assert not (tmp_path / "state" / "lock").exists()


def test_a_guard_held_too_long_is_refused_not_waited_for(tmp_path, monkeypatch):
    """A stopped agent holding the guard never makes another wait for ever (GUARD_WAIT_S)."""
    import fcntl

    from ddtree_deploy.hostprog import lock as lock_mod

    a, b = _agents(tmp_path)
    assert a.handle({"op": "lock", "run_id": "ra"})["ok"]
    monkeypatch.setattr(lock_mod, "GUARD_WAIT_S", 0.3)
    fd = os.open(tmp_path / "state" / "lock.guard", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)  # standing in for an agent stopped inside a fenced step
    try:
        t0 = time.monotonic()
        reply = b.handle({"op": "lock_release", "force": True})
        assert time.monotonic() - t0 < 5
    finally:
        os.close(fd)
    assert reply["code"] == "locked" and "stayed held for 0.3 s" in reply["message"], reply
    assert (tmp_path / "state" / "lock").exists()  # nothing was released
    a.lock.release()


def test_an_agent_stuck_in_the_guard_is_named_by_lock_release_and_push(host, oracle):
    """An agent stopped while it holds lock.guard (the test hook stops it inside its rename's
    fenced step): `lock release --force` and a second `push` give the waiting agent's own
    answer, which names that process and how to find it, within their read deadline (the
    guard wait is shorter than it: here 10 s under a 30 s deadline, and 2 s when the
    inventory's op_timeout is 6 s), never "deploy lock held by ? since ?" or "no answer ...
    raise host.op_timeout" (issue 28 item 5)."""
    pristine, patched = oracle
    a = start_controller(host, "push", {"stop_in_guard_after_renames": 1})
    pid = stopped_agent(host, a)
    try:
        released = cli("lock", "release", "--host", host.name, "--force")
        assert released.exit_code == 1, released.output
        said = " ".join(released.stderr.split())
        assert f"lock.guard stayed held for 10 s by process {pid} (a ddtree-deploy host program, stopped): " \
               "nothing was changed" in said, said
        assert f"`ps -o pid,stat,etime,args -p {pid}`" in said and f"`kill -CONT {pid}`" in said, said
        assert "op_timeout" not in said and "held by ?" not in said
        host.inventory(smoke_levels=[], op_timeout=6)  # a short read deadline: the guard wait follows it
        pushed = cli("push", "--host", host.name)
        assert pushed.exit_code == 1, pushed.output
        said = " ".join(pushed.stderr.split())
        assert f"lock.guard stayed held for 2 s by process {pid} (a ddtree-deploy host program, stopped)" in said, said
        assert "held by ?" not in said and "op_timeout" not in said
    finally:
        os.kill(pid, signal.SIGCONT)
    first = finish(a, "push")
    assert first["code"] == 0, first
    assert files_now(host) == {p: patched[p] for p in TARGETS}
    assert not (host.state_dir / "lock").exists()
