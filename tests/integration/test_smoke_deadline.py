"""The controller's deadlines while the smoke program runs (smoke_run.run_on_host).

Real processes, no stand-in: the real smoke program runs under the local transport (the
same program the SSH transport ships), held inside its compile level by a named pipe it
reads (opening a FIFO blocks until a writer comes). A level past its deadline, and a
program gone silent (SIGSTOP: no more heartbeats), are each one line naming the host,
the level and the seconds, within about that many seconds, not the 600 s a read used to
wait.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.remote.local import LocalTransport
from ddtree_deploy.settings.inventory import Host
from ddtree_deploy.settings.smoke import LaunchSettings, SmokeSettings
from ddtree_deploy.smoke.plan import SmokePlan, level_deadlines, plan_smoke, silence_limit
from ddtree_deploy.smoke.run import run_on_host


def _stuck_plan(tmp_path, **request) -> tuple[SmokePlan, str]:
    fifo = str(tmp_path / "stuck.py")
    os.mkfifo(fifo)
    req = {"levels": ["compile"], "compile": {"files": [fifo]}, **request}
    return SmokePlan(levels=("compile",), request=req), fifo


def _release(fifo: str) -> None:
    """Let a program blocked on the FIFO go on (it reads EOF and finishes by itself)."""
    try:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass  # nobody reads it any more


def test_a_level_past_its_deadline_is_one_line_naming_host_level_and_seconds(tmp_path):
    plan, fifo = _stuck_plan(tmp_path)
    plan = SmokePlan(plan.levels, plan.request, deadlines={"compile": 2.0})
    host = Host(name="box", python=sys.executable, ssh=None, source="hosts/box.toml")
    started = time.monotonic()
    try:
        with pytest.raises(DeployError) as caught:
            run_on_host(host, LocalTransport(), plan)
    finally:
        _release(fifo)
    took = time.monotonic() - started
    assert str(caught.value) == "box: smoke level compile did not finish within 2 s"
    assert caught.value.code == "timeout"
    assert "ddtree-deploy status --host box" in caught.value.hint
    assert 2.0 <= took < 10.0


def test_a_silent_program_is_noticed_after_three_missed_heartbeats_10_s_at_least(tmp_path):
    plan, fifo = _stuck_plan(tmp_path, heartbeat_s=0.5)
    # The host's python: the real one, its pid written down so the test can freeze it.
    pid_file = tmp_path / "pid"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\nexec 3<&0\n"{sys.executable}" "$@" <&3 &\necho $! > "{pid_file}"\nwait $!\n')
    wrapper.chmod(0o755)
    host = Host(name="box", python=str(wrapper), ssh=None)
    frozen = []

    def freeze():
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text().strip():
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)
        time.sleep(1.2)  # in its compile level by now, beating every 0.5 s
        pid = int(pid_file.read_text())
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)

    thread = threading.Thread(target=freeze, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        with pytest.raises(DeployError) as caught:
            run_on_host(host, LocalTransport(), plan)
    finally:
        thread.join(30)
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
        _release(fifo)
    assert frozen, "the program never started"
    assert str(caught.value) == ("box: smoke level compile: no word from the host for 10 s (the smoke program "
                                 "sends a heartbeat every 0.5 s): the link or the program is stuck")
    assert caught.value.code == "timeout"
    assert 10.0 <= time.monotonic() - started < 25.0


def test_each_level_waits_the_sum_of_its_own_host_deadlines_plus_slack():
    settings = SmokeSettings(levels=("compile", "import", "cli", "launch"), timeout_s=100.0,
                             launch=LaunchSettings(model="/m", draft_model="/d", ready_timeout_s=500.0,
                                                   probe_timeout_s=50.0, term_grace_s=10.0))
    plan = plan_smoke(settings, touched_paths=["sglang/srt/a.py"], flags=(), log_path="/tmp/x.log")
    # compile: no host deadline (120 s); import/cli: timeout_s + 60; launch: nvidia-smi 30 +
    # ready 500 + last poll 10 + probe and tree requests 2 x 50 + server_info 60 + term 10 + kill 15 + 60.
    assert plan.deadlines == {"compile": 120.0, "import": 160.0, "cli": 160.0, "launch": 785.0}
    assert level_deadlines(plan.request) == plan.deadlines
    assert silence_limit(plan.request) == 60.0  # three 20 s heartbeats
    assert silence_limit({"heartbeat_s": 0.5}) == 10.0  # never under 10 s
