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
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import free_port
from ddtree_testkit import STANDIN_SERVER
from ddtree_testkit.supervised import Supervised

sys.path.insert(0, str(Path(__file__).parent))
from envelope_check import check_envelope  # noqa: E402
from sshd_host import ADDED, DEPLOY_SERIES, SPEC, UTILS, cli, sshd  # noqa: E402,F401

pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server as a GPU host's "
                    "supervisor would")
pytestmark = pytest.mark.sshd

CONSOLE = Path(sys.executable).parent / "ddtree-deploy"
BUDGET = 8


class Served:
    """A sandbox host whose stand-in server runs under its own supervisord."""

    def __init__(self, sshd, root: Path, name: str, *, unhealthy_with: str | None = None, ready_after: float = 0.0,
                 serve: dict | None = None):
        self.host = sshd.add_host(name, root / name, files=[SPEC, UTILS])
        self.port = free_port()
        argv = [str(self.host.python), str(STANDIN_SERVER), "--model-path", "/models/target",
                "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", str(BUDGET),
                "--port", str(self.port), "--package-file", SPEC, "--ready-after", str(ready_after)]
        if unhealthy_with:
            argv += ["--unhealthy-with", unhealthy_with]
        self.sup = Supervised(root / name / "supervisor", "sglang", argv)
        self.inventory = self.host.inventory(smoke_levels=[])
        table = {"restart": self.sup.restart_argv, "url": f"http://127.0.0.1:{self.port}",
                 "ready_timeout_s": 20, "poll_s": 0.2, "budget": BUDGET, **(serve or {})}
        with open(self.inventory, "a") as fh:
            fh.write("\n[serve]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))

    @property
    def name(self) -> str:
        return self.host.name

    def info(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/server_info", timeout=5) as r:
            return json.loads(r.read())

    def serving_sha(self) -> str | None:
        return self.info()["stand_in_package"]["sha256"]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health_generate", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            assert time.monotonic() < deadline, f"{self.name}: the stand-in never became healthy"
            time.sleep(0.1)


@pytest.fixture
def served(sshd, tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    made: list[Served] = []

    def make(name: str, **kw) -> Served:
        s = Served(sshd, tmp_path, name, **kw)
        s.sup.start()
        made.append(s)
        s.wait_healthy()
        return s

    yield make
    for s in made:
        s.sup.stop()


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
    assert st.exit_code == 0, st.output
    assert "serving code older than the files" in st.stdout and f"pid {old_pid}" in st.stdout
    assert f"ddtree-deploy restart --host {s.name}" in st.stdout
    doc = jdoc(cli("status", "--host", s.name, "--json"), "status")
    serving = doc["hosts"][0]["serving"]
    assert serving["state"] == "stale" and [p["pid"] for p in serving["processes"]] == [old_pid]
    assert serving["processes"][0]["before_files"] is True and serving["health"]["status"] == 200

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
    hist = jdoc(cli("history", "--host", s.name, "--json"), "history")["entries"]
    assert hist[0]["event"] == "restart" and hist[0]["outcome"] == "healthy" and hist[0]["command"] == "restart"

    # rollback with [serve]: the files, then the server restarted on them (health only).
    rb = cli("rollback", "--host", s.name)
    assert rb.exit_code == 0, rb.output
    assert "server restarted (health only): healthy" in rb.stdout
    assert sha(s.host.read(SPEC)) == pristine and s.serving_sha() == pristine and s.sup.pid() != new_pid

    # push with [serve]: switch, restart, health, proof, then `deployed`; the output ends healthy.
    before_push = s.sup.pid()
    p = cli("push", "--host", s.name)
    assert p.exit_code == 0, p.output
    last = p.stdout.strip().splitlines()[-1]
    assert last.endswith("server healthy on the new code: journal marked deployed"), p.stdout
    assert "DDTREE verify width 9 = budget 8 + 1" in p.stdout
    assert s.serving_sha() == patched and s.sup.pid() != before_push
    journal = json.loads((s.host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "deployed" and journal["serve"]["state"] == "healthy"
    assert journal["serve"]["run_id"] == journal["run_id"]
    events = [(e["event"], e["outcome"]) for e in jdoc(cli("history", "--host", s.name, "--json"),
                                                        "history")["entries"][:3]]
    assert events == [("mark", "ok"), ("restart", "healthy"), ("push", "ok")]

    # Pushed again: nothing to switch, the server already runs these files: no restart.
    again = cli("push", "--host", s.name)
    assert again.exit_code == 0 and "serving the current files" in again.stdout
    assert s.sup.pid() is not None and s.serving_sha() == patched
