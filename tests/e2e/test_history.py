"""The host's append-only audit history: written by the agent inside each locked op,
read back with `ddtree-deploy history`. A real sshd on loopback and real SGLang files
(tests/sshd_host.py), as tests/e2e/test_push.py; the rotation and the torn-line cases run
the agent in-process on a real state folder.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import socket
import subprocess

import pytest

from ddtree_deploy.hostprog import history as history_mod
from ddtree_deploy.hostprog.agent import Agent
from ddtree_deploy.hostprog.state import foreign_content
from ddtree_deploy.hostprog.wire import boot_id, process_start

from ddtree_deploy.sandbox import SandboxHost  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, cli, ok  # noqa: E402


def history(h: SandboxHost, *extra: str) -> dict:
    return json.loads(ok("history", "--host", h.name, "--json", *extra).stdout)["hosts"][0]


@pytest.mark.sshd
def test_push_rollback_and_a_broken_lock_are_recorded_newest_first(host, oracle):
    pristine, patched = oracle
    assert history(host)["entries"] == []  # no state folder yet: an empty history, nothing created
    assert not host.state_dir.exists()

    pushed = json.loads(ok("push", "--host", host.name, "--json").stdout)["hosts"][0]
    ok("push", "--host", host.name)  # a no-op takes the lock but changes nothing: no entry
    ok("rollback", "--host", host.name)
    doc = history(host)
    assert [e["event"] for e in doc["entries"]] == ["rollback", "push"] and doc["total"] == 2
    rolled, push = doc["entries"]
    me = f"{getpass.getuser()}@{socket.gethostname()}"
    assert push["holder"] == me and push["from"] == socket.gethostname()
    assert push["outcome"] == "ok" and push["phase"] == "deployed" and push["command"] == "push"
    assert push["series"] == "sglang-0.5.12" and len(push["series_id"]) == 64
    assert push["backup_id"] == pushed["backup_id"] and push["run_id"] == pushed["run_id"]
    sha = lambda b: hashlib.sha256(b).hexdigest() if b is not None else None  # noqa: E731
    assert push["files"] == {p: {"from": sha(pristine[p]), "to": sha(patched[p])} for p in (SPEC, UTILS, ADDED)}
    assert rolled["outcome"] == "ok" and rolled["phase"] == "rolled-back"
    assert rolled["files"][ADDED] == {"from": sha(patched[ADDED]), "to": None}
    assert push["time"] <= rolled["time"]

    # A hostile lock holder (markup, an escape sequence) broken by --break-lock: recorded,
    # and printed inert.
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        (host.state_dir / "lock").mkdir()
        (host.state_dir / "lock" / "owner.json").write_text(json.dumps({
            "run_id": "hung[/]", "holder": "eve\x1b[31m@[bold]x", "command": "push", "time": "2026-11-01T10:00:00Z",
            "host": socket.gethostname(), "pid": sleeper.pid, "pid_start": process_start(sleeper.pid),
            "boot_id": boot_id()}))
        ok("push", "--host", host.name, "--break-lock")
    finally:
        sleeper.kill()
        sleeper.wait()
    events = [e["event"] for e in history(host)["entries"]]
    assert events == ["push", "lock-break", "rollback", "push"]
    text = ok("history", "--host", host.name).stdout
    assert "4 of 4 history entries, newest first" in text
    assert "lock of run hung[/] by eve\\x1b[31m@[bold]x" in text and "\x1b" not in text
    assert text.index("lock-break") < text.index("rollback")  # newest first
    assert [e["event"] for e in history(host, "--limit", "1")["entries"]] == ["push"]
    assert cli("history", "--host", host.name, "--limit", "0").exit_code == 2


@pytest.mark.sshd
def test_a_failed_append_never_fails_the_push(host, oracle):
    _pristine, patched = oracle
    (host.state_dir / "history.jsonl").mkdir(parents=True)  # the append cannot open it
    (host.state_dir / ".ddtree-deploy-state").write_text("{}\n")
    pushed = ok("push", "--host", host.name, "--json")
    assert {p: host.read(p) for p in (SPEC, UTILS, ADDED)} == patched
    # ... and the operator is told, on stderr and in the JSON.
    said = f"the audit history was not written: {host.state_dir}/history.jsonl: Is a directory (errno EISDIR)"
    assert json.loads(pushed.stdout)["hosts"][0]["history_warning"] == said
    stderr = " ".join(pushed.stderr.split())  # warnings wrap between words at the terminal's width
    assert said in stderr and "history not written: the audit" not in stderr  # said once
    a = Agent(str(host.state_dir))
    a.package.root = str(host.site)  # the history is its install's (hostprog/roots.py): the root is known first
    assert a.history.record("push", outcome="ok") == said


def test_rotation_keeps_the_newest_entries_and_the_folder_stays_ours(tmp_path, monkeypatch):
    monkeypatch.setattr(history_mod, "HISTORY_MAX_BYTES", 600)
    state = tmp_path / "state"
    state.mkdir()
    a = Agent(str(state))
    a.package.root = str(tmp_path / "site")  # the history is its install's; check_state_dir refuses nesting in it
    for i in range(12):
        assert a.history.record("mark", run_id=f"r{i}", outcome="ok") is None
    assert (state / "history.jsonl").stat().st_size < 600 + 300
    assert (state / "history.1.jsonl").exists()
    doc = a.history.op_history({"limit": 100})
    runs = [e["run_id"] for e in doc["entries"]]
    assert runs == [f"r{i}" for i in range(11, 11 - len(runs), -1)] and 4 <= len(runs) < 12
    assert foreign_content(str(state)) is None  # history files are the agent's own layout


def test_a_torn_line_is_skipped_and_the_next_entry_stays_whole(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    a = Agent(str(state))
    a.package.root = str(tmp_path / "site")
    a.history.record("push", run_id="r1", outcome="ok")
    with open(state / "history.jsonl", "ab") as f:
        f.write(b'{"event": "push", "run_')  # a full disk cut this append
    a.history.record("rollback", run_id="r2", outcome="ok")
    doc = a.history.op_history({"limit": 10})
    assert [e["run_id"] for e in doc["entries"]] == ["r2", "r1"] and doc["unreadable"] == 1
    assert oct(os.stat(state / "history.jsonl").st_mode & 0o777) == "0o600"


def test_a_refused_apply_is_recorded_with_its_code(tmp_path):
    """The agent in-process on a real folder standing in for the package root: the file changed
    since it was read, so apply refuses ("changed") and the history says so, holder and all."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "x.py").write_text("now\n")
    a = Agent(str(tmp_path / "state"))
    a.package.root = str(site)
    assert a.lock.op_lock({"run_id": "r1", "holder": "carol@ctl-1", "command": "push"})["owner"]["run_id"] == "r1"
    reply = a.handle({"op": "apply", "kind": "push", "run_id": "r1", "final_phase": "deployed",
                      "files": [{"path": "x.py", "expect": "0" * 64, "want": "1" * 64, "data": ""}],
                      "journal": {"series": "s", "series_id": "f" * 64}})
    a.lock.release()
    assert reply["ok"] is False and reply["code"] == "changed" and "history_warning" not in reply
    [entry] = a.history.op_history({"limit": 5})["entries"]
    assert (entry["event"], entry["outcome"], entry["phase"]) == ("push", "changed", None)
    assert entry["holder"] == "carol@ctl-1" and entry["from"] == "ctl-1" and entry["run_id"] == "r1"
    assert "x.py changed since it was read" in entry["error"]
    assert entry["files"] == {"x.py": {"from": "0" * 64, "to": "1" * 64}}


# Lines that are valid JSON but not an entry the agent wrote (#22): each broke the reader.
ODD_LINES = [
    b'{"event": ["push"], "run_id": "x"}',  # event of another type: `what += ...` raised TypeError
    b'{"event": "push", "files": 7}',  # len(7)
    b'{"event": "push", "outcome": {"a": 1}, "phase": "deployed"}',
    b'{"event": "push", "series": 3, "series_id": [1]}',
    b'{"event": "push", "previous": "lock", "time": 12}',
    b'{"event": "push", "holder": true}',
    b"[" * 100_000,  # json.loads: RecursionError (killed the agent's history read)
    b'{"event": "push", "x": ' + b"[" * 40 + b"]" * 40 + b"}",  # parses, but nests past any entry we write
    b"\xff\xfe not utf-8",
    b"42", b'"a string"', b"null",
]


def test_lines_of_unexpected_types_or_depth_are_skipped_and_counted(tmp_path):
    """The agent's reader: whatever a line holds, it is an entry or it is skipped and counted."""
    state = tmp_path / "state"
    state.mkdir()
    a = Agent(str(state))
    a.package.root = str(tmp_path / "site")
    a.history.record("push", run_id="r1", outcome="ok", files={"a.py": {"from": None, "to": "1" * 64}})
    with open(state / "history.jsonl", "ab") as f:
        f.write(b"\n".join(ODD_LINES) + b"\n")
    a.history.record("rollback", run_id="r2", outcome="ok")
    doc = a.handle({"op": "history", "limit": 10})
    assert doc["ok"] is True, doc
    assert [e["run_id"] for e in doc["entries"]] == ["r2", "r1"]
    assert doc["total"] == 2 and doc["unreadable"] == len(ODD_LINES)


def test_history_cli_skips_odd_lines_in_text_and_json(host, oracle):
    """Over a real sshd: `history` (text and --json) prints the good entries and the count of
    skipped lines; never an internal error. The controller checks the entries again (an older
    agent on the host sends them unchecked)."""
    ok("push", "--host", host.name)
    with open(host.state_dir / "history.jsonl", "ab") as f:
        f.write(b"\n".join(ODD_LINES) + b"\n")
    text = cli("history", "--host", host.name)
    assert text.exit_code == 0, text.output
    assert "1 of 1 history entries" in text.stdout and f"({len(ODD_LINES)} unreadable line(s) skipped" in text.stdout
    doc = history(host)
    assert [e["event"] for e in doc["entries"]] == ["push"] and doc["unreadable"] == len(ODD_LINES)


def test_the_controller_skips_entries_an_old_agent_sends_unchecked(monkeypatch):
    """A STAND-IN at the transport seam: the reply an agent without the check gives (it sends
    every dict line): the controller's reader skips and counts the same entries."""
    from ddtree_deploy.session import hostlog
    from ddtree_deploy.settings.inventory import Host

    reply = {"ok": True, "entries": [{"event": "push", "run_id": "r1"}, {"event": ["x"]}, {"event": "x", "files": 3}],
             "total": 3, "unreadable": 1}
    monkeypatch.setattr(hostlog, "_call", lambda *_a, **_k: reply)
    doc = hostlog.history(Host(name="h", python="p", ssh=None), None, 10)
    assert doc["entries"] == [{"event": "push", "run_id": "r1"}] and doc["total"] == 1 and doc["unreadable"] == 3
