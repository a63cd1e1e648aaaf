"""How many SSH connections each command opens, counted for real (issue 24, item 9).

The docs state these numbers (docs/deploy.md, docs/smoke.md); here every
SSH connection the CLI opens to a real sshd on loopback is counted where it is made: each
``SSHTransport.open`` that connected (the one place the toolkit opens a connection; a
transport opened twice connects once). A TCP relay counting accepted connections was tried
first and missed one now and then under load (the log of opens showed both connected), so
the count is taken at the transport. The hosts are the deploy tests' sandbox hosts with the
small real series; the smoke's import level fails for real on them (only the two touched
SGLang files are installed), so a failed smoke and its automatic rollback are real too. The
``[serve]`` cases use tests/serve_host.py (a stand-in server under a real supervisord).
"""

from __future__ import annotations

import threading

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.remote import ssh
from sshd_host import DEPLOY_SERIES, SPEC, UTILS

pytestmark = pytest.mark.sshd


class Counter:
    """Counts the SSH connections opened (a successful ``SSHTransport.open`` that connected)."""

    def __init__(self, monkeypatch):
        self.opened = 0
        self._count = threading.Lock()
        real = ssh.SSHTransport.open
        counter = self

        def open(self) -> None:
            fresh = self.conn is None
            real(self)
            if fresh and self.conn is not None:
                with counter._count:
                    counter.opened += 1

        monkeypatch.setattr(ssh.SSHTransport, "open", open)

    def take(self) -> int:
        with self._count:
            n, self.opened = self.opened, 0
        return n


@pytest.fixture
def env(sshd, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    return Counter(monkeypatch)


def run(*argv: str, code: int = 0) -> None:
    r = CliRunner().invoke(app, list(argv))
    assert r.exit_code == code, r.output


@pytest.mark.parametrize("levels, pushed, after", [
    ([], 0, 1),                       # the deploy agent's session only (the switch journals deployed)
    (["compile"], 0, 2),              # + the smoke program's connection (the mark: on the first)
    (["compile", "import"], 1, 2),    # the automatic rollback rides the first too (under the push's lock)
])
def test_a_push_opens_one_connection_plus_one_for_the_smoke_and_none_for_its_rollback(
        sshd, env, tmp_path, levels, pushed, after):  # noqa: F811
    h = sshd.add_host(f"c{len(levels)}", tmp_path / "h", files=[SPEC, UTILS])
    h.inventory(smoke_levels=levels)
    run("push", "--host", h.name, code=pushed)
    assert env.take() == after
    run("status", "--host", h.name)
    assert env.take() == 1
    run("rollback", "--host", h.name)
    assert env.take() == 1
    run("push", "--host", h.name, "--dry-run")
    assert env.take() == 1


def test_with_serve_a_restart_opens_one_more_and_a_failed_one_two_more(sshd, env, tmp_path):  # noqa: F811
    pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in server")
    from serve_host import Served
    from sshd_host import ADDED

    made = []
    try:
        for name, kw in (("srv", {}), ("bad", {"unhealthy_with": ADDED, "serve": {"ready_timeout_s": 4}})):
            s = Served(sshd, tmp_path, name, **kw)
            s.sup.start()
            made.append(s)
            s.wait_healthy()
        env.take()
        run("push", "--host", "srv")  # deploy + the restart (health, proof): the mark rides the first
        assert env.take() == 2
        run("status", "--host", "srv")  # the serving check rides the status connection
        assert env.take() == 1
        run("restart", "--host", "srv")  # the deploy lock's session (held) + the restart program
        assert env.take() == 2
        run("rollback", "--host", "srv")  # the rollback's session (its lock held) + the restart program
        assert env.take() == 2
        # The new files never become healthy: deploy + restart, then the rollback on the push's
        # session (its lock still held) and a restart on the old files (the program).
        run("push", "--host", "bad", code=1)
        assert env.take() == 3
    finally:
        for s in made:
            s.sup.stop()
