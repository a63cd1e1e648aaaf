"""Ctrl-C and SIGTERM while the controller waits on a silent host (issue #22): exit 130 within a
second, one JSON envelope, and a line per host saying what it waited for, what that leaves on
the host and what to run next.

Real parts: the console script in its own process, a real sshd on loopback with real SGLang
files (tests/sshd_host.py), and a TCP proxy of ours between them (tests/link_faults.py) that relays faithfully until
the client has sent a given number of bytes, then stops forwarding the host's answers (the
"blackholed" link: nothing is closed, nothing arrives). Before the fix the fleet loop joined
its worker, which waited for the 120 s op_timeout, and the session's close waited 60 s more
for an exit status.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envelope_check import check_envelope  # noqa: E402
from link_faults import StallProxy  # noqa: E402
from sshd_host import DEPLOY_SERIES, SPEC, UTILS  # noqa: E402

from ddtree_testkit.machine import settle, within  # noqa: E402

pytestmark = pytest.mark.sshd
CONSOLE = Path(sys.executable).parent / "ddtree-deploy"
#: The bound the issue sets, from the signal to the process's exit: the toolkit's own second, on
#: top of what the machine needs now for any Python process of the CLI's size to exit
#: (ddtree_testkit.machine: a loaded 2-core machine can take most of a second for that alone).
WITHIN_S = 1.0


@pytest.fixture(scope="module")
def world(sshd, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interrupt")
    proxy = StallProxy(sshd.port)
    sshd.trust(port=proxy.port)
    h = sshd.add_host("stalled", tmp / "host", files=[SPEC, UTILS])
    hosts = tmp / "hosts"
    h.inventory(hosts, port=proxy.port, smoke_levels=[])
    env = dict(os.environ, DDTREE_DEPLOY_PATCHES=str(DEPLOY_SERIES / "patches"),
               DDTREE_DEPLOY_SNAPSHOT=str(tmp / "snapshot"), DDTREE_DEPLOY_HOSTS=str(hosts))
    env.pop("DDTREE_DEPLOY_TEST_HOOKS", None)
    yield {"h": h, "proxy": proxy, "env": env}
    proxy.close()


def run(w, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(CONSOLE), *args], capture_output=True, text=True, env=w["env"], timeout=120)


def wait_unlocked(h, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while (h.state_dir / "lock").exists():
        assert time.monotonic() < deadline, "the agent never released the lock after the link closed"
        time.sleep(0.05)


def interrupt_when_stalled(w, args: list[str], stall_after: int, sig=signal.SIGINT) -> tuple:
    """Start the CLI, let it stall at ``stall_after`` bytes, signal it; (process, seconds to exit, the
    machine's contention just before the signal, out, err)."""
    w["proxy"].arm(stall_after)
    proc = subprocess.Popen([str(CONSOLE), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=w["env"])
    try:
        assert w["proxy"].stalled.wait(60), "the run never reached the stall point"
        busy = settle(1.0)  # it is now waiting on the silent host
        assert proc.poll() is None, proc.communicate()
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=150)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        w["proxy"].arm(None)
    return proc, took, busy, out, err


def upstream_bytes(w, *args: str) -> int:
    """Client -> host bytes of a clean run through the proxy."""
    w["proxy"].arm(None)
    done = run(w, *args)
    assert done.returncode == 0, done.stderr
    return w["proxy"].sent


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_a_blackholed_apply_is_exit_130_within_a_second(world, oracle, sig):
    w, h = world, world["h"]
    pristine, patched = oracle
    total = upstream_bytes(w, "push", "--host", h.name)
    assert run(w, "rollback", "--host", h.name).returncode == 0
    # The apply + unlock request is the last big write of a push: its whole request reaches
    # the host, then every answer is dropped. The controller waits for the apply's reply.
    proc, took, busy, out, err = interrupt_when_stalled(w, ["push", "--host", h.name, "--json"], total - 400, sig)
    assert proc.returncode == 130, err[-2000:]
    fast, said = within(took, WITHIN_S, "from the signal to the exit", busy)
    assert fast, said
    print(f"\n{signal.Signals(sig).name} during a blackholed apply: exit 130 after {took:.2f} s")
    doc = check_envelope(out, 130, "push")
    how = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    message = doc["error"]["message"]
    assert doc["error"]["code"] == "interrupted" and message.startswith(f"interrupted ({how}): {h.name}: "), message
    assert "interrupted waiting for apply+unlock" in message and "the host agent goes on alone" in message, message
    assert f"`ddtree-deploy status --host {h.name}` shows" in message
    assert "Traceback" not in err and f"interrupted ({how})" in err
    # What the line said: the agent, which had the whole request, finishes it and releases the lock.
    wait_unlocked(h)
    status = json.loads(run(w, "status", "--host", h.name, "--json").stdout)["hosts"][0]
    assert status["phase"] == "deployed" and not status["mixed"]
    assert {p: h.read(p) for p in patched} == patched
    assert run(w, "rollback", "--host", h.name).returncode == 0


def test_interrupt_during_a_blackholed_read_in_the_main_thread(world):
    """`history` waits in the main thread (no fleet): the session's close no longer waits 60 s
    for an exit status that never comes."""
    w, h = world, world["h"]
    total = upstream_bytes(w, "history", "--host", h.name)
    proc, took, busy, out, err = interrupt_when_stalled(w, ["history", "--host", h.name, "--json"], total - 200)
    fast, said = within(took, WITHIN_S, "from the signal to the exit", busy)
    assert proc.returncode == 130 and fast, (proc.returncode, said, err[-2000:])
    doc = check_envelope(out, 130, "history")
    assert "interrupted waiting for init+history: no file on the host was changed" in doc["error"]["message"]
    wait_unlocked(h)


def test_sigterm_while_connecting_to_a_fleet(tmp_path):
    """Two hosts whose port accepts and never speaks SSH: `status` on both (the fleet loop)."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        for name in ("mute1", "mute2"):
            (tmp_path / f"{name}.toml").write_text(
                f'[ssh]\nhost = "127.0.0.1"\nport = {port}\nconnect_timeout = 60\n\n'
                f'[host]\npython = "/usr/bin/python3"\nstate_dir = "{tmp_path / name}"\n')
        env = dict(os.environ, DDTREE_DEPLOY_HOSTS=str(tmp_path))
        proc = subprocess.Popen([str(CONSOLE), "status", "--host", "mute1", "--host", "mute2", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        silent.settimeout(30)
        conns = [silent.accept()[0], silent.accept()[0]]  # both are blocked on our silence
        busy = settle(0.5)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=90)
        took = time.monotonic() - t0
        for c in conns:
            c.close()
    fast, said = within(took, WITHIN_S, "from the signal to the exit", busy)
    assert proc.returncode == 130 and fast, (proc.returncode, said, err[-2000:])
    doc = check_envelope(out, 130, "status")
    message = doc["error"]["message"]
    for name in ("mute1", "mute2"):
        assert f"{name}: interrupted while connecting to 127.0.0.1: nothing was sent to the host" in message, message
