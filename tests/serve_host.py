"""A sandbox host whose server runs under a real supervisor: the serving tests' host
(tests/e2e/test_serve_ssh.py, tests/e2e/test_json_envelope.py).

The host is ddtree_deploy.sandbox's (a real sshd on loopback, SGLang 0.5.12.post1's real
files, the small real series of tests/sshd_host.py); its server is the named STAND-IN for
SGLang's HTTP server (ddtree_testkit/standin_server.py), started and restarted by
supervisord (ddtree_testkit/supervised.py), and its inventory's [serve] table restarts it
with the supervisor's own `supervisorctl restart` argv.
"""

from __future__ import annotations

import json
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ddtree_deploy.sandbox import free_port
from ddtree_testkit import STANDIN_SERVER
from ddtree_testkit.supervised import Supervised
from sshd_host import DEPLOY_SERIES, SPEC, UTILS

BUDGET = 8

# A restart (or drain) command that forks: a child that would restart the server once the
# run is over (issue 28: one did, 4.5 s after the push ended, outside any lock), and a
# grandchild; it writes their pids, then hangs past its timeout.
FORKING = r"""
import os, subprocess, sys, time
pids, marker = sys.argv[1], sys.argv[2]
late = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(3); open(sys.argv[1], 'w').write('late')",
                         marker])
inner = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
time.sleep(0.5)
open(pids, "w").write(" ".join(map(str, [os.getpid(), late.pid, inner.pid])))
time.sleep(60)
"""


def forking_command(folder: Path, pids: Path, marker: Path) -> list[str]:
    """The argv of FORKING (written into ``folder``): it writes its pids to ``pids``; its late
    child writes ``marker`` 3 s after it started, unless it was killed."""
    script = folder / "forking.py"
    script.write_text(FORKING)
    return [sys.executable, str(script), str(pids), str(marker)]


# FORKING's late child writes its marker this long after it started (the `time.sleep(3)` above).
LATE_S = 3.0


def wait_past_the_late_moment(pids: Path) -> None:
    """Until FORKING's late child would have written its marker, had it lived: it started just
    before its parent slept 0.5 s and wrote ``pids``, and acts LATE_S after its own start (plus
    its interpreter's start: a 1 s margin). Counted from that file, not from the end of the run,
    which already took most of it (a fixed 3.5 s after the run waited ~2 s for nothing)."""
    remaining = pids.stat().st_mtime + LATE_S + 0.5 - time.time()
    if remaining > 0:
        time.sleep(remaining)


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper runs nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class StandinProbes:
    """What a test reads of a stand-in server listening on ``self.port`` of this machine."""

    name: str
    port: int

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


class Served(StandinProbes):
    """A sandbox host whose stand-in server runs under its own supervisord."""

    def __init__(self, sshd, root: Path, name: str, *, unhealthy_with: str | None = None, ready_after: float = 0.0,
                 serve: dict | None = None, extra_argv: list[str] | None = None, package_file: str = SPEC,
                 tables: str = "", host=None):
        # ``host``: a sandbox host made by the caller (a whole release venv, where SGLang's own
        # benchmark must run there); else one with the series' files only (fast)
        self.host = host if host is not None else sshd.add_host(name, root / name, files=[SPEC, UTILS])
        self.port = free_port()
        argv = [str(self.host.python), str(STANDIN_SERVER), "--model-path", "/models/target",
                "--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", str(BUDGET),
                "--port", str(self.port), "--package-file", package_file, "--ready-after", str(ready_after)]
        if unhealthy_with:
            argv += ["--unhealthy-with", unhealthy_with]
        argv += list(extra_argv or ())  # e.g. the speed model: --enable-metrics --traffic N (test_speed_gate_ssh)
        self.sup = Supervised(root / name / "supervisor", "sglang", argv)
        self.inventory = self.host.inventory(smoke_levels=[])
        table = {"restart": self.sup.restart_argv, "url": f"http://127.0.0.1:{self.port}",
                 "ready_timeout_s": 20, "poll_s": 0.2, "budget": BUDGET, **(serve or {})}
        with open(self.inventory, "a") as fh:
            fh.write("\n[serve]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()) + tables)

    @property
    def name(self) -> str:
        return self.host.name



@pytest.fixture
def served(sshd, tmp_path, monkeypatch):
    """``served(name, **kw)``: a new Served host (its supervisord started, its server healthy);
    the CLI finds it by name. Every supervisord is stopped at the end of the test.

        from serve_host import served  # noqa: F401  (the fixture)
    """
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
