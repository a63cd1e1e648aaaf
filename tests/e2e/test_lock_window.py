"""No other run acts on a host between a push's switch and its undoing: a push whose smoke
fails, or whose restarted server is not healthy, rolls the files back (and restarts the
server on them) under the deploy lock it already holds, and `rollback` with a `[serve]`
table restarts the server under its own; the lock is released only at the end.

Two real controllers against a real sshd on loopback (tests/sshd_host.py; the served hosts'
stand-in server under a real supervisord, tests/serve_host.py). The first controller (the
console script) gets the agent's test hook ``stop_before_each_request``: each of its host
agents notes and stops itself (SIGSTOP) before every request it receives. At every such stop
once the first run has taken its lock, a second controller (the CLI, in process) tries to
push and to restart (or roll back) the host, and must be refused with `locked`, until the
first run's last request (its unlock) has been handled. The stopped points include the old
gaps: before this change the first run unlocked, then a new agent connection took the lock
again for the rollback (and a third one for the restart), and the probe at that new agent's
first request found the lock free (the second controller's push went through).
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
from sshd_host import ADDED, cli, wait_stopped  # noqa: E402

pytestmark = pytest.mark.sshd
CONSOLE = Path(sys.executable).parent / "ddtree-deploy"


def _owner(state_dir: Path) -> dict | None:
    try:
        return json.loads((state_dir / "lock" / "owner.json").read_text())
    except (OSError, ValueError):
        return None


def probe_every_stop(name: str, state_dir: Path, argv: list[str], seconds: tuple[str, ...],
                     work: Path) -> tuple[dict, int, list[str]]:
    """Run ``ddtree-deploy <argv> --host name --json`` with every agent request held open in
    turn; at each one after its lock was taken, each command of ``seconds`` from a second
    controller must be refused (locked). Returns (its JSON document, its exit code, the ops
    before which the second controller was refused)."""
    log = work / "stops.log"
    out, err = work / "first.out", work / "first.err"
    env = dict(os.environ, DDTREE_DEPLOY_TEST_HOOKS=json.dumps({"stop_before_each_request": str(log)}))
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([str(CONSOLE), *argv, "--host", name, "--json"], stdout=o, stderr=e, text=True,
                                env=env)
    seen, probed, held, stopped = 0, [], False, None
    try:
        while True:
            lines = log.read_text().splitlines() if log.exists() else []
            if len(lines) == seen:
                if proc.poll() is not None:
                    break
                time.sleep(0.02)
                continue
            pid, op = lines[seen].split()
            seen, stopped = seen + 1, int(pid)
            wait_stopped(stopped)
            owner = _owner(state_dir)
            held = held or (owner is not None and owner.get("command") == argv[0])
            if held:  # from the first run's lock on, until its last request: nobody else gets in
                for second in seconds:
                    r = cli(second, "--host", name, "--json")
                    doc = check_envelope(r.stdout, r.exit_code, second)
                    error = (doc["hosts"][0].get("error") or {}) if doc["hosts"] else {}
                    assert r.exit_code == 1 and error.get("code") == "locked", (
                        f"`{second}` was not refused before the first run's {op} (its request #{seen}, "
                        f"lock: {owner}): {r.output}")
                probed.append(op)
            os.kill(stopped, signal.SIGCONT)
            stopped = None
        proc.wait(timeout=120)
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    return check_envelope(out.read_text(), proc.returncode, argv[0]), proc.returncode, probed


def test_a_failed_smoke_rolls_back_under_the_push_lock(host, oracle, tmp_path):
    """The smoke fails (import: this host's venv has only the series' files): the rollback
    reads the host and applies under the push's own lock; the unlock goes with its apply."""
    pristine, _patched = oracle
    host.inventory(smoke_levels=["import"])
    doc, code, probed = probe_every_stop(host.name, host.state_dir, ["push"], ("push", "rollback"), tmp_path)
    h = doc["hosts"][0]
    assert code == 1 and h["outcome"] == "failed, rolled back", h
    assert h["auto_rollback"]["done"] is True and h["auto_rollback"]["outcome"]["round_trips"] == 2
    # lock+facts, apply (the switch), [smoke], facts, apply+unlock (the rollback): one agent session.
    assert probed == ["facts", "apply", "facts", "apply", "unlock"], probed
    assert h["round_trips"] == 5 and h["connections"] == 1  # deploy.py's table, docs/deploy.md
    assert {p: host.read(p) for p in pristine} == pristine
    journal = json.loads((host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "rolled-back" and journal["run_id"] == h["auto_rollback"]["outcome"]["run_id"]
    assert _owner(host.state_dir) is None
    entries = json.loads(cli("history", "--host", host.name, "--json").stdout)["hosts"][0]["entries"]
    assert [(e["event"], e["run_id"]) for e in entries[:2]] == [("rollback", journal["run_id"]), ("push", h["run_id"])]


def test_an_unhealthy_server_is_rolled_back_and_restarted_under_the_push_lock(served, tmp_path):
    """The restarted server is not healthy on the new files: the rollback and the restart on
    the old files happen under the push's lock, released after the restart is recorded."""
    s = served("window1", unhealthy_with=ADDED, serve={"ready_timeout_s": 3})
    before = s.host.read(ADDED), s.serving_sha()  # the added module absent, the pristine file served
    doc, code, probed = probe_every_stop(s.name, s.host.state_dir, ["push"], ("push", "restart"), tmp_path)
    h = doc["hosts"][0]
    assert code == 1 and h["outcome"] == "failed, rolled back", h
    gate = h["serve"]
    assert gate["restart"]["state"] == "unhealthy" and gate["rolled_back"]["changed"] is True
    assert gate["restart_after_rollback"]["state"] == "healthy" and gate["down"] is False
    # lock+facts, apply, served x2 (the restart on the new files), facts, apply (the rollback),
    # served x2 (the restart on the old files), unlock: all on the push's session.
    assert probed == ["facts", "apply", "served", "served", "facts", "apply", "served", "served", "unlock"], probed
    assert h["round_trips"] == 10 and h["connections"] == 1
    assert (s.host.read(ADDED), s.serving_sha()) == before and s.healthy()
    journal = json.loads((s.host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "rolled-back" and journal["serve"]["state"] == "healthy"
    assert journal["serve"]["run_id"] == journal["run_id"] == gate["rolled_back"]["run_id"]
    assert _owner(s.host.state_dir) is None


def test_rollback_restarts_the_server_under_its_own_lock(served, tmp_path):
    s = served("window2")
    assert cli("push", "--host", s.name).exit_code == 0
    doc, code, probed = probe_every_stop(s.name, s.host.state_dir, ["rollback"], ("push", "restart"), tmp_path)
    h = doc["hosts"][0]
    assert code == 0 and h["outcome"] == "rolled back" and h["serve"]["restart"]["state"] == "healthy", h
    # init, lock (not yet held), then facts, apply, served x2, unlock: one agent session.
    assert probed == ["facts", "apply", "served", "served", "unlock"], probed
    assert h["round_trips"] == 5 and h["connections"] == 1
    assert _owner(s.host.state_dir) is None and s.healthy()
