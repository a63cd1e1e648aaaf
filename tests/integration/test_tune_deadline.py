"""The controller's deadlines while the tune program runs (tune_run.Session.run).

Real processes: a real sshd on loopback, the real release with the real series pushed, the
real tune program over SSH, SGLang's own bench_serving (the host of tests/tune_host.py).
The server is ddtree_testkit/standin_tune_server.py, a STAND-IN for SGLang's server (no GPU
here); ``--ready-after`` makes it slow (or never) ready, and the test freezes processes
with SIGSTOP:

- the tune program frozen mid-launch (no more heartbeats): one line naming the host, the
  step and the silence, after about the silence limit (10 s at least), not the 600 s an
  SSH read used to wait; once it runs again it sees the link gone and stops its server;
- a server frozen before it is ready, past the launch step's deadline (given short here):
  one line naming the host, the launch of which configuration and the seconds; the
  results file keeps the run that finished, and ``--resume`` runs only the rest.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.settings.inventory import load_host
from ddtree_deploy.smoke import plan as smoke_plan
from ddtree_deploy.tuning import tune, run as tune_run

# The inventory helpers of the end-to-end tune tests; their host, tuned_host, is a shared
# fixture (tests/tune_host.py, registered by tests/conftest.py).
from tune_host import alive, pids, wait_for, write_inventory

# Markers per test: the last test (the deadline rule) is pure.

OPTS = tune.TuneOptions(budgets=(16,), topk=(2,), concurrency=(2,), baselines=("none",), requests=4,
                        input_len=16, output_len=16, repeats=0)


def _host(inventory: Path):
    host = load_host(str(inventory))
    return host, lambda: transport_for(host)


def _lines(results: Path) -> list[dict]:
    return [json.loads(x) for x in results.read_text().splitlines()]


@pytest.mark.sshd
@pytest.mark.sglang_env
def test_a_step_longer_than_the_silence_limit_that_beats_all_along_is_not_silent(tuned_host, tmp_path):
    """Every line read starts the silence anew, a heartbeat too: a launch of 14 s beating every
    0.5 s outlives the 10 s silence limit and is no silence (a prompt file's categories make
    one concurrency's step several benchmark runs long)."""
    h = tuned_host
    inventory, _ = write_inventory(h, ["--ready-after", "14"])
    host, make_transport = _host(inventory)
    outcome = tune_run.tune_host(host, make_transport, OPTS, out_dir=tmp_path / "out", heartbeat_s=0.5)
    assert [(r.config.key, r.status) for r in outcome.records] == [("none", "ok"), ("ddtree-b16-k2", "ok")]


@pytest.mark.sshd
@pytest.mark.sglang_env
def test_a_frozen_tune_program_is_noticed_after_the_silence_limit(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--ready-after", "3600", "--pid-file", str(pid_file)])
    host, make_transport = _host(inventory)
    owner = h["test_host"].state_dir / "tune" / "lock" / "owner.json"
    frozen: list[int] = []

    def freeze():
        try:
            wait_for(lambda: owner.exists() and pids(pid_file), 120, "the server's launch")
        except AssertionError:
            return
        time.sleep(1.5)  # in its launch step, beating every 0.5 s
        pid = json.loads(owner.read_text())["pid"]  # the tune program's own pid (its lock)
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)

    thread = threading.Thread(target=freeze, daemon=True)
    thread.start()
    out = tmp_path / "out"
    started = None
    try:
        with pytest.raises(DeployError) as caught:
            started = time.monotonic()
            tune_run.tune_host(host, make_transport, OPTS, out_dir=out, heartbeat_s=0.5)
        took = time.monotonic() - started
    finally:
        thread.join(150)
        for pid in frozen:
            os.kill(pid, signal.SIGCONT)
    assert frozen, "the tune program never launched the server"
    assert str(caught.value) == ("gpu1: tune: launch of none: no word from the host for 10 s (the tune program "
                                 "sends a heartbeat every 0.5 s): the link or the program is stuck")
    assert caught.value.code == "timeout"
    assert "--resume" in caught.value.hint and "ddtree-deploy status --host gpu1" in caught.value.hint
    assert smoke_plan.silence_limit({"heartbeat_s": 0.5}) == 10.0  # the smoke's rule, reused
    assert took < 60.0, took  # the silence limit after the freeze, not 600 s
    # Running again, the tune program finds the link gone: it stops its server, releases its lock.
    for pid in pids(pid_file):
        wait_for(lambda: not alive(pid), 40, f"server {pid} to stop")
    wait_for(lambda: not owner.parent.exists(), 30, "the tune lock to be released")
    assert [d["kind"] for d in _lines(out / "results.jsonl")] == ["header"]  # nothing half-written


@pytest.mark.sshd
@pytest.mark.sglang_env
def test_a_launch_past_its_deadline_keeps_what_finished_and_resume_continues(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    # Ready 2 s after start: the window in which the second server is frozen before it is ready.
    inventory, _ = write_inventory(h, ["--ready-after", "2", "--pid-file", str(pid_file)])
    host, make_transport = _host(inventory)
    frozen: list[int] = []

    def freeze_second_server():
        try:
            wait_for(lambda: len(pids(pid_file)) >= 2, 300, "the second server")
        except AssertionError:
            return
        pid = pids(pid_file)[1]
        os.kill(pid, signal.SIGSTOP)
        frozen.append(pid)

    thread = threading.Thread(target=freeze_second_server, daemon=True)
    thread.start()
    out = tmp_path / "out"
    results = out / "results.jsonl"
    try:
        with pytest.raises(DeployError) as caught:
            tune_run.tune_host(host, make_transport, OPTS, out_dir=out, deadlines={"launch": 8.0})
    finally:
        thread.join(310)
    assert frozen, "the second server never started"
    assert str(caught.value) == "gpu1: tune: launch of ddtree-b16-k2 did not finish within 8 s"
    assert caught.value.code == "timeout"
    hint = caught.value.hint
    assert f"raise ready_timeout_s in [smoke.launch] of {inventory}" in hint
    assert "`ddtree-deploy tune --host gpu1 --resume`" in hint
    # The tune program stops the frozen server (TERM, then KILL) and releases its lock.
    wait_for(lambda: not alive(frozen[0]), 40, "the frozen server to be stopped")
    wait_for(lambda: not (h["test_host"].state_dir / "tune" / "lock").exists(), 30, "the tune lock")
    assert [(d.get("kind"), d.get("config"), d.get("status")) for d in _lines(results)] == \
        [("header", None, None), ("run", "none", "ok")]

    resumed = tune_run.tune_host(host, make_transport, OPTS, out_dir=out, resume=True)
    assert resumed.resumed == 1
    assert [(r.config.key, r.status) for r in resumed.records] == [("none", "ok"), ("ddtree-b16-k2", "ok")]
    # The finished sweep closes its results with the summary line (the best per concurrency, the schedule).
    lines = _lines(results)
    assert [d["kind"] for d in lines] == ["header", "run", "run", "summary"]
    # (no speculation fastest: the schedule serves B=16 there if it qualified, else it has nothing to serve)
    assert lines[-1]["schedule"] == tune.plan(OPTS, resumed.records).text and lines[-1]["schedule"] in (None, "1:16/2")
    for pid in pids(pid_file):
        assert not alive(pid), pid


def test_each_run_step_waits_its_host_deadlines_plus_the_smoke_slack():
    request = {"ready_timeout_s": 500.0, "term_grace_s": 10.0, "bench": {"timeout_s": 600.0}}
    # launch: nvidia-smi 30 + ready 500 + last poll 10 + stop (term 10 + kill 15) + slack 60;
    # bench: its own 600 + the bench's stop 20 + the server's stop 25 + 60; end: server_info 60 + 25 + 60.
    assert tune_run.run_deadlines(request) == {"launch": 625.0, "bench": 705.0, "end": 145.0}
