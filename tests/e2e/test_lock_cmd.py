"""`ddtree-deploy lock status|release` against a real sshd on loopback (ddtree_deploy/sandbox/sshd.py):
the lock files are written as a real agent writes them, for a live process (a `sleep`)
and for a dead one, and the release is read back from the host's history.
"""

from __future__ import annotations

import itertools
import json
import socket
import subprocess

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.hostprog.wire import boot_id, process_start

from ddtree_deploy.sandbox import SandboxHost as TestHost  # noqa: E402
from sshd_host import SPEC, UTILS  # noqa: E402

pytestmark = pytest.mark.sshd
_names = itertools.count()


@pytest.fixture
def host(sshd, tmp_path, monkeypatch) -> TestHost:
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    h = sshd.add_host(f"lk{next(_names)}", tmp_path / "host", files=[SPEC, UTILS])
    h.inventory(smoke_levels=[])
    h.state_dir.mkdir()
    (h.state_dir / ".ddtree-deploy-state").write_text("{}\n")
    return h


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def lock_as(h: TestHost, pid: int, pid_start, holder="alice@laptop", run_id="hung-run") -> None:
    (h.state_dir / "lock").mkdir()
    (h.state_dir / "lock" / "owner.json").write_text(json.dumps({
        "run_id": run_id, "holder": holder, "command": "push", "time": "2026-11-01T10:00:00Z",
        "host": socket.gethostname(), "pid": pid, "pid_start": pid_start, "boot_id": boot_id()}))


def released_entries(h: TestHost) -> list[dict]:
    doc = json.loads(cli("history", "--host", h.name, "--json").stdout)["hosts"][0]
    return [e for e in doc["entries"] if e["event"] == "lock-release"]


def test_a_free_lock(host):
    free = cli("lock", "status", "--host", host.name)
    assert free.exit_code == 0 and f"{host.name}: lock free" in free.stdout
    doc = json.loads(cli("lock", "status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert doc["lock"] is None and doc["host"] == host.name
    nothing = cli("lock", "release", "--host", host.name)
    assert nothing.exit_code == 0 and "nothing to release" in nothing.stdout


def test_a_live_lock_is_released_only_with_force(host, sleeper):
    lock_as(host, sleeper.pid, process_start(sleeper.pid))
    shown = cli("lock", "status", "--host", host.name)
    assert shown.exit_code == 0
    assert (f"lock held by alice@laptop since 2026-11-01T10:00:00Z (run hung-run, push, pid {sleeper.pid}"
            in shown.stdout) and "live" in shown.stdout
    doc = json.loads(cli("lock", "status", "--host", host.name, "--json").stdout)["hosts"][0]
    assert doc["lock"]["stale"] is False and doc["lock"]["run_id"] == "hung-run"

    refused = cli("lock", "release", "--host", host.name)
    assert refused.exit_code == 1 and "not released" in refused.stderr and "--force" in refused.stderr
    assert (host.state_dir / "lock" / "owner.json").exists() and released_entries(host) == []
    refused_json = cli("lock", "release", "--host", host.name, "--json")
    assert refused_json.exit_code == 1 and json.loads(refused_json.stdout)["error"]["code"] == "locked"

    forced = cli("lock", "release", "--host", host.name, "--force", "--json")
    assert forced.exit_code == 0, forced.output
    assert json.loads(forced.stdout)["hosts"][0]["released"] is True and not (host.state_dir / "lock").exists()
    [entry] = released_entries(host)
    assert entry["outcome"] == "forced" and entry["previous"]["run_id"] == "hung-run"
    assert entry["holder"].endswith("@" + socket.gethostname()) and entry["from"] == socket.gethostname()


def test_a_stale_lock_is_released_without_force(host):
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock_as(host, dead.pid, "1", holder="bob[/]\x1b]0;x\x07@ci")
    shown = cli("lock", "status", "--host", host.name)
    assert shown.exit_code == 0 and "stale (its process is gone)" in shown.stdout
    assert "bob[/]\\x1b]0;x\\x07@ci" in shown.stdout and "\x1b" not in shown.stdout  # host text is inert
    done = cli("lock", "release", "--host", host.name)
    assert done.exit_code == 0 and "released the lock of run hung-run" in done.stdout
    assert not (host.state_dir / "lock").exists()
    [entry] = released_entries(host)
    assert entry["outcome"] == "stale-released"
