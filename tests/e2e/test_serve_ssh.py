"""The push ends with the new code serving and healthy: `status` on a server older than the
files, the restart in push / rollback / `restart`, the failing-health rollback, a fleet of
four rolling in waves, and Ctrl-C during a health wait.

Real parts: sandbox hosts over a real OpenSSH sshd on loopback (ddtree_deploy.sandbox), each
with SGLang 0.5.12.post1's real files and the small real series (tests/sshd_host.py); the
server runs under a real supervisor, supervisord from PyPI (ddtree_testkit/supervised.py:
systemd cannot run here), restarted by the inventory's own `supervisorctl restart` argv.
The server itself is the named STAND-IN for SGLang's HTTP server
(ddtree_testkit/standin_server.py: SGLang's endpoints and ready line, no model: this machine
has no GPU). It reads a file of the installed package once at start and reports its sha256
in /server_info, so a test sees which files the serving process picked up; with
`--unhealthy-with FILE` it never becomes ready when that file exists (the series' added
module): a change that breaks the server, which the push must roll back.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envelope_check import check_envelope  # noqa: E402
from serve_host import BUDGET, Served, alive, forking_command, wait_past_the_late_moment  # noqa: E402
from sshd_host import ADDED, SPEC, UTILS, cli  # noqa: E402

pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server as a GPU host's "
                    "supervisor would")
pytestmark = pytest.mark.sshd

CONSOLE = Path(sys.executable).parent / "ddtree-deploy"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def jdoc(result, command: str) -> dict:
    return check_envelope(result.stdout, result.exit_code, command)


# ---------------------------------------------------------------- status, push, restart, rollback


def test_status_sees_old_code_then_push_restarts_it_healthy_on_the_new_files(served):
    s = served("srv1")
    pristine = sha(s.host.read(SPEC))
    old_pid = s.sup.pid()
    assert s.serving_sha() == pristine

    # Files switched without [serve] (a push as before): the server still runs the old code.
    plain = s.host.inventory(s.host.server.hosts_dir / "plain", smoke_levels=[])
    assert cli("push", "--host", str(plain)).exit_code == 0
    patched = sha(s.host.read(SPEC))
    assert patched != pristine and s.serving_sha() == pristine and s.sup.pid() == old_pid

    st = cli("status", "--host", s.name)
    assert st.exit_code == 1, st.output  # serving stale code: the host is not fine
    assert "serving code older than the files" in st.stdout and f"pid {old_pid}" in st.stdout
    assert st.stdout.splitlines()[-1].startswith(f"{s.name}: needs attention: serving code older than the files: "
                                                 f"pid {old_pid}"), st.stdout
    assert f"ddtree-deploy restart --host {s.name}" in st.stdout
    doc = jdoc(cli("status", "--host", s.name, "--json"), "status")
    serving = doc["hosts"][0]["serving"]
    assert serving["state"] == "stale" and [p["pid"] for p in serving["processes"]] == [old_pid]
    assert serving["processes"][0]["before_files"] is True and serving["health"]["status"] == 200

    # push with [serve] on these deployed files: nothing to switch, but the server is older than
    # them: it is restarted (the new code serving is the end of a push).
    p = cli("push", "--host", s.name)
    assert p.exit_code == 0, p.output
    assert "already deployed" in p.stdout and "server: serving code older than the files" in p.stdout
    assert "server restarted: healthy" in p.stdout and s.serving_sha() == patched
    old_pid = s.sup.pid()

    # `restart`: the lock, the supervisor's restart, health, the DDTree proof; recorded.
    r = cli("restart", "--host", s.name, "--json")
    assert r.exit_code == 0, r.output
    host_doc = jdoc(r, "restart")["hosts"][0]
    assert host_doc["outcome"] == "restarted, healthy" and host_doc["restart"]["state"] == "healthy"
    assert host_doc["restart"]["tree"]["verify_width"] == BUDGET + 1
    new_pid = s.sup.pid()
    assert new_pid != old_pid and s.serving_sha() == patched
    assert [p["pid"] for p in host_doc["restart"]["after"]] == [new_pid]
    st = jdoc(cli("status", "--host", s.name, "--json"), "status")["hosts"][0]
    assert st["serving"]["state"] == "current" and st["phase"] == "deployed"
    assert "server restarted" in st["explanation"] and "healthy" in st["explanation"]
    hist = jdoc(cli("history", "--host", s.name, "--json"), "history")["hosts"][0]["entries"]
    assert hist[0]["event"] == "restart" and hist[0]["outcome"] == "healthy" and hist[0]["command"] == "restart"

    # rollback with [serve]: the files, then the server restarted on them (health only).
    rb = cli("rollback", "--host", s.name)
    assert rb.exit_code == 0, rb.output
    assert "server restarted (health only): healthy" in rb.stdout
    assert sha(s.host.read(SPEC)) == pristine and s.serving_sha() == pristine and s.sup.pid() != new_pid

    # push with [serve]: switch, smoke, restart, health, proof, then `deployed`; the output ends healthy.
    before_push = s.sup.pid()
    p = cli("push", "--host", s.name, "--level", "compile")
    assert p.exit_code == 0, p.output
    assert "compile" in p.stdout and "smoke passed" in p.stdout
    last = p.stdout.strip().splitlines()[-1]
    assert last.endswith("server healthy on the new code: journal marked deployed"), p.stdout
    assert "DDTREE verify width 9 = budget 8 + 1" in p.stdout
    assert s.serving_sha() == patched and s.sup.pid() != before_push
    journal = json.loads((s.host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "deployed" and journal["serve"]["state"] == "healthy"
    assert journal["serve"]["run_id"] == journal["run_id"]
    events = [(e["event"], e["outcome"]) for e in jdoc(cli("history", "--host", s.name, "--json"),
                                                        "history")["hosts"][0]["entries"][:3]]
    assert events == [("mark", "ok"), ("restart", "healthy"), ("push", "ok")]

    # Pushed again: nothing to switch, the server already runs these files: no restart.
    again = cli("push", "--host", s.name)
    assert again.exit_code == 0 and "serving the current files" in again.stdout
    assert s.sup.pid() is not None and s.serving_sha() == patched


def test_a_deployed_host_whose_server_died_after_its_proof_is_not_fine(served):
    """A push proved the server healthy and marked the host deployed; then the server died.
    `status` must not end on `deployed ... healthy` with exit 0: the server is NOT healthy
    now, the host needs attention (exit 1), and that is its last line."""
    s = served("died")
    assert cli("push", "--host", s.name, "--level", "compile").exit_code == 0
    st = cli("status", "--host", s.name)
    assert st.exit_code == 0 and "phase: deployed" in st.stdout, st.output
    subprocess.run([*s.sup.ctl, "stop", "sglang"], check=True, capture_output=True, timeout=60)
    assert not s.healthy()
    st = cli("status", "--host", s.name)
    assert st.exit_code == 1, st.output
    assert "phase: deployed" in st.stdout and "healthy then" in st.stdout  # the journal's record, in the past
    last = st.stdout.splitlines()[-1]
    assert last == (f"{s.name}: needs attention: server NOT healthy now (http://127.0.0.1:{s.port}/health_generate: "
                    "no answer)"), st.stdout
    doc = jdoc(cli("status", "--host", s.name, "--json"), "status")
    assert doc["exit_code"] == 1 and doc["hosts"][0]["outcome"] == "needs attention"
    assert [a["kind"] for a in doc["hosts"][0]["attention"]] == ["unhealthy"]


def test_a_restart_command_past_its_timeout_is_killed_with_its_whole_group(served, tmp_path):
    """Over sshd, through `restart`: the inventory's restart command forks (a child that would
    restart the server 3 s later, a grandchild) and hangs past restart_timeout_s. The serve
    program kills and reaps its whole process group and says how many processes; nothing of
    it acts after the run; the server it never restarted is still the old one."""
    pids, marker = tmp_path / "pids", tmp_path / "restarted-late"
    s = served("forks", serve={"restart": forking_command(tmp_path, pids, marker), "restart_timeout_s": 2})
    old_pid = s.sup.pid()
    r = cli("restart", "--host", s.name, "--json")
    assert r.exit_code == 1, r.output
    restart = jdoc(r, "restart")["hosts"][0]["restart"]
    assert (restart["state"], restart["failed"]) == ("unhealthy", "restart")
    assert restart["detail"] == "the restart command did not finish within 2 s: its process group was killed " \
                                "(4 processes)"
    assert restart["restart"]["killed"] == 4 and restart["restart"]["left"] == []
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 3 and not any(alive(pid) for pid in started)
    wait_past_the_late_moment(pids)  # past the moment the late child would have acted
    assert not marker.exists() and s.sup.pid() == old_pid  # nothing restarted anything after the run
    entries = jdoc(cli("history", "--host", s.name, "--json"), "history")["hosts"][0]["entries"]
    assert (entries[0]["event"], entries[0]["outcome"]) == ("restart", "unhealthy")


# ---------------------------------------------------------------- stale by content, not by time


def serving_of(name: str) -> dict:
    return jdoc(cli("status", "--host", name, "--json"), "status")["hosts"][0]["serving"]


def test_a_server_is_stale_when_its_bytes_differ_from_the_files_not_when_the_files_are_newer(served):
    """A server that started before the last switch runs other code only when the files hold
    other bytes than those it started with: after a rollback they are the same again. Decided
    from the history's per-file from/to of the switches since it started; where the history
    cannot tell (rotated away), by the times, and `status` says so."""
    from ddtree_deploy.hostprog.agent import Agent
    from ddtree_deploy.hostprog.history import HISTORY_MAX_BYTES

    s = served("stale1")
    pid = s.sup.pid()
    plain = s.host.inventory(s.host.server.hosts_dir / "plain", smoke_levels=[])  # no [serve]: no restart

    # The push's smoke fails and it rolls back: the files were newer than the server, but hold
    # again exactly the bytes it loaded: current (the time rule called it stale).
    failed = cli("push", "--host", s.name, "--level", "import")
    assert failed.exit_code == 1 and "rolled back automatically" in failed.stdout, failed.output
    assert s.sup.pid() == pid
    serving = serving_of(s.name)
    assert serving["state"] == "current", serving
    (proc,) = serving["processes"]
    assert proc["pid"] == pid and proc["before_files"] is True and proc["stale"] is False
    assert proc["decided_by"] == "content"
    assert "the files hold again the bytes it started with" in serving["explanation"]
    text = cli("status", "--host", s.name).stdout
    assert f"pid {pid} started" in text and "before the last switch, since undone" in text
    assert "serving code older than the files" not in text

    # A real push: the files hold other bytes than it loaded: stale, by content.
    assert cli("push", "--host", str(plain)).exit_code == 0
    serving = serving_of(s.name)
    assert serving["state"] == "stale" and serving["processes"][0]["decided_by"] == "content", serving
    assert "the files no longer hold the bytes it started with" in serving["explanation"]
    # Rolled back: current again; pushed again: stale again (the first switch since its start
    # has the bytes it loaded, whatever came after).
    assert cli("rollback", "--host", str(plain)).exit_code == 0
    assert serving_of(s.name)["state"] == "current"
    assert cli("push", "--host", str(plain)).exit_code == 0
    assert serving_of(s.name)["state"] == "stale"
    assert cli("rollback", "--host", str(plain)).exit_code == 0
    assert serving_of(s.name)["state"] == "current"

    # The history rotated (the agent's own rotation, after padding to its bound): what it
    # held since the server's start is gone, so the times decide, and the sentence says so.
    with open(s.host.state_dir / "history.jsonl", "ab") as fh:
        fh.write(b" " * HISTORY_MAX_BYTES + b"\n")
    agent = Agent(str(s.host.state_dir))
    agent.package.root = str(s.host.site)  # the history is its install's (hostprog/roots.py)
    agent.history.record("lock-release", outcome="stale-released")
    assert (s.host.state_dir / "history.1.jsonl").exists()
    serving = serving_of(s.name)
    assert serving["state"] == "stale" and serving["processes"][0]["decided_by"] == "time", serving
    assert ("taken as older by the times alone: the host's history no longer reaches back to its start "
            "(rotated away)") in serving["explanation"]
    assert s.sup.pid() == pid  # nothing was restarted all along


# ---------------------------------------------------------------- a server the new files break


def test_an_unhealthy_start_after_a_push_rolls_back_and_restarts_the_old_code(served):
    s = served("srv2", unhealthy_with=ADDED, serve={"ready_timeout_s": 4})
    pristine = {p: s.host.read(p) for p in (SPEC, UTILS, ADDED)}
    old_pid = s.sup.pid()

    r = cli("push", "--host", s.name, "--json")
    assert r.exit_code == 1, r.output
    h = jdoc(r, "push")["hosts"][0]
    assert h["outcome"] == "failed, rolled back"
    gate = h["serve"]
    assert gate["restart"]["state"] == "unhealthy" and gate["restart"]["failed"] == "health"
    assert "not healthy 4 s after the restart (last health status 503)" in gate["restart"]["detail"]
    assert gate["rolled_back"]["changed"] is True and gate["down"] is False
    assert gate["restart_after_rollback"]["state"] == "healthy" and gate["restart_after_rollback"]["proof"] is None
    # The old files are back, byte for byte, and the server restarted on them is healthy.
    assert {p: s.host.read(p) for p in pristine} == pristine
    assert s.healthy() and s.serving_sha() == sha(pristine[SPEC]) and s.sup.pid() not in (old_pid, None)
    journal = json.loads((s.host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "rolled-back" and journal["serve"]["state"] == "healthy"
    entries = jdoc(cli("history", "--host", s.name, "--json"), "history")["hosts"][0]["entries"]
    assert [(e["event"], e["outcome"]) for e in entries[:4]] == [
        ("restart", "healthy"), ("rollback", "ok"), ("restart", "unhealthy"), ("push", "ok")]
    # The rollback is recorded as the push's own: after which push, and why (the health).
    auto = entries[1]["automatic"]
    assert (auto["push_run"], auto["cause"], auto["step"]) == (h["run_id"], "serve", "health")
    assert auto["detail"].startswith("the server was not healthy 4 s after the restart")
    assert f"rollback (AUTOMATIC, after push run {h['run_id']}: server health failed after the restart)" in \
        cli("history", "--host", s.name).stdout

    # Without the text the same story: one line per step, ending with the old code healthy.
    text = cli("push", "--host", s.name)
    assert text.exit_code == 1
    assert "smoke: not run (no smoke levels configured)" in text.stdout
    assert "server restarted: NOT healthy (health)" in text.stdout
    assert "after the rollback: server restarted (health only): healthy" in text.stdout

    # --no-rollback keeps the new files: the host stays `switched`, its server down, and says so.
    kept = cli("push", "--host", s.name, "--no-rollback", "--json")
    assert kept.exit_code == 1
    h = jdoc(kept, "push")["hosts"][0]
    assert h["outcome"] == "failed, NOT rolled back" and h["serve"]["kept_new_files"] is True
    assert h["serve"]["down"] is True and not s.healthy()
    st = jdoc(cli("status", "--host", s.name, "--json"), "status")["hosts"][0]
    assert st["phase"] == "switched" and "NOT healthy" in st["explanation"]
    assert f"ddtree-deploy push --host {s.name}" in st["explanation"]
    assert st["serving"]["state"] == "current" and st["serving"]["health"]["status"] == 503
    # A `restart` that ends unhealthy names the next step: these files never passed a restart.
    again = cli("restart", "--host", s.name)
    assert again.exit_code == 1, again.output
    said = " ".join(again.stdout.split())
    assert f"{s.name}: server NOT healthy: server restarted: NOT healthy (health): " in said, said
    assert (f"the files are a push's whose server never passed its restart: `ddtree-deploy rollback --host "
            f"{s.name}` puts the old code back") in said, said
    assert again.stdout.strip().splitlines()[-1].startswith(f"{s.name}: next: the files are a push's"), said
    back = cli("rollback", "--host", s.name)
    assert back.exit_code == 0, back.output
    assert s.healthy() and {p: s.host.read(p) for p in pristine} == pristine


# ---------------------------------------------------------------- a fleet rolls in waves


class DownWatch:
    """Polls every host's health from this side (every 20 ms) and keeps when each was down."""

    def __init__(self, hosts: list[Served]):
        self.hosts = hosts
        self.samples: list[tuple[float, frozenset[str]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            down = frozenset(h.name for h in self.hosts if not h.healthy())
            self.samples.append((time.monotonic(), down))
            time.sleep(0.02)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def most_down(self) -> int:
        return max(len(d) for _t, d in self.samples)

    def first_down(self, name: str) -> float:
        return min(t for t, d in self.samples if name in d)

    def last_down(self, name: str) -> float:
        return max(t for t, d in self.samples if name in d)


def test_a_fleet_of_four_rolls_in_waves_canary_first_never_more_than_parallel_down(served, sshd):
    hosts = [served(f"wave{i}", ready_after=1.0) for i in range(4)]
    names = [h.name for h in hosts]
    with open(sshd.hosts_dir / "groups.toml", "w") as fh:
        fh.write(f"[groups]\nfour = {json.dumps(names)}\n")
    old = {h.name: h.sup.pid() for h in hosts}

    with DownWatch(hosts) as watch:
        r = cli("push", "--group", "four", "--parallel", "2", "--json")
    assert r.exit_code == 0, r.output
    doc = jdoc(r, "push")
    assert doc["policy"] == {"canary": names[0], "parallel": 2, "max_failures": 0, "waves": True}
    by = {h["host"]: h for h in doc["hosts"]}
    assert {n: by[n]["outcome"] for n in names} == {n: "pushed" for n in names}
    assert [by[n]["wave"] for n in names] == [1, 2, 2, 3]
    for h in hosts:  # every server restarted and serving the patched files
        assert h.sup.pid() != old[h.name] and h.serving_sha() == sha(h.host.read(SPEC))
    # Each wave starts after the previous one ended (healthy), by the run's own clock ...
    end = {n: by[n]["started_s"] + by[n]["elapsed_s"] for n in names}
    assert by[names[1]]["started_s"] >= end[names[0]] and by[names[2]]["started_s"] >= end[names[0]]
    assert by[names[3]]["started_s"] >= max(end[names[1]], end[names[2]])
    # ... and as the servers' health showed from outside: the canary was down (restarting)
    # and healthy again before any other went down, and never more than 2 at once.
    assert all(any(n in d for _t, d in watch.samples) for n in names), "a restart was never seen"
    assert watch.last_down(names[0]) < min(watch.first_down(n) for n in names[1:])
    assert watch.most_down() <= 2
    assert max(watch.last_down(names[1]), watch.last_down(names[2])) < watch.first_down(names[3])
    assert "wave" in r.stderr and "start" in r.stderr  # the outcome table is the wave timeline

    # `restart` rolls the same way, one at a time with --parallel 1.
    with DownWatch(hosts) as watch:
        rr = cli("restart", "--group", "four", "--parallel", "1", "--json")
    assert rr.exit_code == 0, rr.output
    assert [h["wave"] for h in jdoc(rr, "restart")["hosts"]] == [1, 2, 3, 4]
    assert watch.most_down() <= 1


# ---------------------------------------------------------------- Ctrl-C or a cut link during the restart


def _journal(s: Served) -> dict:
    return json.loads((s.host.state_dir / "journal.json").read_text())


@pytest.mark.parametrize("how", ["ctrl-c", "cut-link"])
def test_a_push_stopped_during_its_server_restart_says_the_truth_and_the_host_records_the_end(served, sshd,
                                                                                                tmp_path, how):
    """Ctrl-C, or the network gone under both connections, while a push waits for its server's
    health (issue 28 items 4 and 5): the last word says the files were switched (journal
    `switched`: not deployed) and the server may be down, never "no file on the host was
    changed", and never "not healthy: rolling back" before any health check ended; the host's
    serve program completes the restart alone and records its end (the journal does not stay
    `restarting`), so status tells how the server ended."""
    from link_faults import CutProxy

    s = served(f"stop-{how}", unhealthy_with=ADDED, serve={"ready_timeout_s": 8})
    old_pid = s.sup.pid()
    inventory = s.inventory
    proxy = None
    if how == "cut-link":  # the same host reached through a relay that can cut every link at once
        proxy = CutProxy(sshd.port)
        sshd.trust(port=proxy.port)
        inventory = tmp_path / "via-relay" / f"{s.name}.toml"
        inventory.parent.mkdir()
        inventory.write_text(s.inventory.read_text().replace(f"port = {sshd.port}\n", f"port = {proxy.port}\n"))
    proc = subprocess.Popen([str(CONSOLE), "push", "--host", str(inventory), "--no-smoke"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:  # the restart has happened and the push waits for a health that never comes
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        journal = s.host.state_dir / "journal.json"
        state = _journal(s).get("serve", {}).get("state") if journal.exists() else None
        if state == "restarting" and s.sup.pid() not in (None, old_pid):
            break
        time.sleep(0.1)
    time.sleep(1.0)
    stopped = time.monotonic()
    if proxy is None:
        proc.send_signal(signal.SIGINT)
    else:
        proxy.cut_all()
    stdout, stderr = proc.communicate(timeout=60)
    assert time.monotonic() - stopped < 20
    said = " ".join((stdout + stderr).split())
    assert "no file on the host was changed" not in said and "stops what it started" not in said, said
    assert "rolling back" not in said and "not healthy" not in said.lower(), said  # no health check had ended
    if proxy is None:
        assert proc.returncode == 130, stderr
        assert "this run's push switched the files (journal phase `switched`: not deployed); a server restart " \
               "is under way (the server may be down or restarting)" in said, said
        assert "the serve program goes on alone: it completes the restart it was given" in said, said
    else:
        proxy.close()
        assert proc.returncode == 1, said
        assert f"{s.name}: failed, state unknown: " in stdout, said
        assert "the server restart's outcome is UNKNOWN: " in said
        assert "the serve program goes on alone: it completes the restart it was given" in said, said
        assert "the files are switched (journal phase `switched`: not deployed) and the server may be down or " \
               f"restarting: `ddtree-deploy status --host {s.name}` shows how the restart ended" in said, said

    # The serve program went on alone: its health wait ended (8 s), and it recorded the end.
    deadline = time.monotonic() + 60
    while _journal(s).get("serve", {}).get("state") == "restarting":
        assert time.monotonic() < deadline, _journal(s)
        time.sleep(0.2)
    journal = _journal(s)
    assert journal["phase"] == "switched" and journal["serve"]["state"] == "unhealthy", journal
    assert journal["serve"]["recorded_by"] == "serve program" and journal["serve"]["failed"] == "health"
    assert journal["serve"]["restart_run"] == journal["run_id"]
    entries = jdoc(cli("history", "--host", s.name, "--json"), "history")["hosts"][0]["entries"]
    assert [(e["event"], e["outcome"], e["run_id"]) for e in entries[:2]] == [
        ("restart", "unhealthy", journal["run_id"]), ("push", "ok", journal["run_id"])]
    st = jdoc(cli("status", "--host", s.name, "--json"), "status")["hosts"][0]
    assert st["phase"] == "switched" and st["lock"] is None
    assert "left it NOT healthy (health: the server was not healthy 8 s after the restart" in st["explanation"]
    assert f"ddtree-deploy push --host {s.name}" in st["explanation"]
    assert st["serving"]["health"]["status"] == 503
    # The way on: a rollback restores the files and restarts the server healthy on them.
    assert cli("rollback", "--host", s.name).exit_code == 0
    assert s.healthy()
