"""How many SSH connections each command opens, counted for real (issue 24, item 9).

The docs state these numbers (README "Deploying", docs/deploy.md, docs/smoke.md); here a TCP
relay of our own sits between the CLI and a real sshd on loopback and counts the connections
it accepts, whatever opens them. The hosts are the deploy tests' sandbox hosts with the small
real series; the smoke's import level fails for real on them (only the two touched SGLang
files are installed), so a failed smoke and its automatic rollback are real too. The
``[serve]`` cases use tests/serve_host.py (a stand-in server under a real supervisord).
"""

from __future__ import annotations

import re
import threading

import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from link_faults import Relay
from sshd_host import DEPLOY_SERIES, SPEC, UTILS, sshd  # noqa: F401  (shared fixtures)

pytestmark = pytest.mark.sshd


class Counter(Relay):
    """A relay that counts the connections it accepted."""

    def __init__(self, target_port: int):
        self.accepted = 0
        self._count = threading.Lock()
        super().__init__(target_port)

    def _pump(self, src, dst, pair, upstream: bool) -> None:
        if upstream:  # one client -> host pump per accepted connection
            with self._count:
                self.accepted += 1
        super()._pump(src, dst, pair, upstream)

    def take(self) -> int:
        with self._count:
            n, self.accepted = self.accepted, 0
        return n


def through(sshd, inventory, counter: Counter) -> None:  # noqa: F811
    """Point ``inventory`` at the counting relay (its host key trusted on that port)."""
    text = inventory.read_text()
    inventory.write_text(re.sub(r"^port = \d+$", f"port = {counter.port}", text, count=1, flags=re.M))
    sshd.trust(counter.port)


@pytest.fixture
def env(sshd, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(DEPLOY_SERIES / "patches"))
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    counter = Counter(sshd.port)
    yield counter
    counter.close()


def run(*argv: str, code: int = 0) -> None:
    r = CliRunner().invoke(app, list(argv))
    assert r.exit_code == code, r.output


@pytest.mark.parametrize("levels, pushed, after", [
    ([], 0, 1),                       # the deploy agent's session only (the switch journals deployed)
    (["compile"], 0, 2),              # + the smoke program's connection (the mark: on the first)
    (["compile", "import"], 1, 3),    # + the automatic rollback's connection after the failed level
])
def test_a_push_opens_one_connection_plus_one_for_the_smoke_plus_one_for_a_rollback(
        sshd, env, tmp_path, levels, pushed, after):  # noqa: F811
    h = sshd.add_host(f"c{len(levels)}", tmp_path / "h", files=[SPEC, UTILS])
    inv = h.inventory(smoke_levels=levels)
    through(sshd, inv, env)
    run("push", "--host", h.name, code=pushed)
    assert env.take() == after
    run("status", "--host", h.name)
    assert env.take() == 1
    run("rollback", "--host", h.name)
    assert env.take() == 1
    run("push", "--host", h.name, "--dry-run")
    assert env.take() == 1


def test_with_serve_a_restart_opens_one_more_and_a_failed_one_three_more(sshd, env, tmp_path):  # noqa: F811
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
            through(sshd, s.inventory, env)
        env.take()
        run("push", "--host", "srv")  # deploy + the restart (health, proof): the mark rides the first
        assert env.take() == 2
        run("status", "--host", "srv")  # the serving check rides the status connection
        assert env.take() == 1
        run("restart", "--host", "srv")  # the deploy lock's session (held) + the restart program
        assert env.take() == 2
        run("rollback", "--host", "srv")  # the rollback + a restart (its lock's session + the program)
        assert env.take() == 3
        # The new files never become healthy: deploy + restart, then the rollback and a restart
        # on the old files (its lock's session + the program).
        run("push", "--host", "bad", code=1)
        assert env.take() == 5
    finally:
        for s in made:
            s.sup.stop()
