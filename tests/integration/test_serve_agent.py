"""The host-side serve program (hostprog/serve.py), run the way a host runs it: shipped over a
LocalTransport to a sandbox interpreter whose site-packages holds SGLang 0.5.12.post1's real
files (ddtree_deploy.sandbox.hostenv), the smoke program ahead of it (serve_run.SERVE_PROGRAM).

The servers are the named STAND-IN for SGLang's HTTP server (ddtree_testkit/standin_server.py:
no GPU here), started by the restart command itself (a small detaching launcher), so these
cases need no supervisor; tests/e2e/test_serve_ssh.py runs them under supervisord over sshd.
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

from ddtree_deploy.hostprog.serve import match_reasons
from ddtree_deploy.remote.agent_session import AgentSession
from ddtree_deploy.remote.local import LocalTransport
from ddtree_deploy.sandbox import free_port
from ddtree_deploy.sandbox.hostenv import make_python_env
from ddtree_deploy.serve import plan as serve_plan, run as serve_run
from ddtree_deploy.settings.inventory import Host
from ddtree_deploy.settings.serve import parse_serve
from ddtree_testkit import STANDIN_SERVER

from serve_host import alive as _alive, forking_command, wait_past_the_late_moment  # noqa: E402

SPEC = "sglang/srt/speculative/spec_info.py"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(host, package root): a sandbox interpreter with SGLang's real files."""
    root = tmp_path_factory.mktemp("serve-env")
    python, site = make_python_env(root / "env", files=[SPEC])
    return Host(name="local", python=str(python), ssh=None, state_dir=str(root / "state")), site


@pytest.fixture
def reap():
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def check(host: Host, files=(SPEC,), settings=None) -> dict:
    return serve_run.check(host, LocalTransport(), serve_plan.check_request(host.python, list(files), settings))


def settings(port: int, restart: list[str], **more):
    table = {"restart": restart, "url": f"http://127.0.0.1:{port}", "ready_timeout_s": 8, "poll_s": 0.1,
             "budget": 8, **more}
    return parse_serve(table, source="test")


def launcher(tmp: Path, host: Host, port: int, *mode: str) -> list[str]:
    """A restart command that starts a stand-in server detached (as a supervisor would) and exits."""
    pid_file = tmp / f"standin-{port}.pid"
    argv = [host.python, str(STANDIN_SERVER), "--model-path", "/m", "--speculative-algorithm", "DDTREE",
            "--speculative-ddtree-budget", "8", "--port", str(port), "--pid-file", str(pid_file), *mode]
    code = ("import subprocess, sys, json; subprocess.Popen(json.loads(sys.argv[1]), start_new_session=True, "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)")
    return [sys.executable, "-c", code, json.dumps(argv)]


def pids_in(tmp: Path, port: int) -> list[int]:
    f = tmp / f"standin-{port}.pid"
    return [int(x) for x in f.read_text().split()] if f.exists() else []


# ---------------------------------------------------------------- which processes serve


def test_match_reasons():
    py, root = "/opt/v/bin/python", "/opt/v/lib/python3.11/site-packages"
    server = [py, "-m", "sglang.launch_server", "--model-path", "/m"]
    assert match_reasons(server, "/home/u", [], py, None, root) == ["interpreter", "module"]
    # Another install's SGLang (its own interpreter, nothing under this root): not ours.
    assert match_reasons(["/other/bin/python", "-m", "sglang.launch_server"], "/", [], py, None, root) == []
    assert match_reasons(["python3", "x.py"], "/home/u", [], py, None, root) == []  # a bare name says nothing
    assert match_reasons(["python3", "x.py"], "/home/u", [], py, py, root) == ["interpreter"]  # its exe is it
    assert match_reasons(["bin/python", "-c", "pass"], "/opt/v", [], py, None, root) == ["interpreter"]
    assert match_reasons(["/usr/bin/python3", f"{root}/sglang/launch_server.py"], "/", [], py, None, root) == ["script"]
    assert match_reasons([py, "/opt/v/bin/sglang", "serve"], "/", [], py, None, root) == ["interpreter", "script"]
    assert match_reasons(["/usr/bin/python3"], f"{root}/sglang", [], py, None, root) == ["cwd"]
    assert match_reasons(["/usr/bin/python3"], "/", [f"{root}/sglang/x.so"], py, None, root) == ["maps"]
    assert match_reasons(["/usr/bin/python3"], root + "-other", [], py, None, root) == []  # a prefix is no parent


def test_discover_groups_children_and_compares_with_the_last_switch(env, tmp_path, reap):
    host, site = env
    # A "server" run by the host's interpreter, with a child of its own (as SGLang's scheduler).
    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
           "time.sleep(60)"
    # The fixture's files were just copied: a process start time has clock-tick resolution
    # (10 ms) and the agent errs towards "started before" (a needless restart, never old code
    # taken as new), so the server starts well after them.
    time.sleep(0.2)
    old = subprocess.Popen([host.python, "-c", code], start_new_session=True)
    reap.append(old.pid)
    time.sleep(0.5)
    # An agent session open beside it (a push in progress): a host program of ours, never a server.
    with LocalTransport() as t, AgentSession(t, host) as agent:
        agent.one({"op": "init", "state_dir": host.state_dir})
        before = check(host)
    (top,) = [p for p in before["processes"] if p["pid"] == old.pid]
    assert top["matched"] == ["interpreter"] and len(top["children"]) == 1
    assert top["before_files"] is False  # the package files are older than it
    assert set(before["all_pids"]) == {old.pid, *top["children"]}  # not the agent, not the serve program

    time.sleep(0.1)
    (site / SPEC).write_bytes((site / SPEC).read_bytes())  # a switch: the file replaced
    after = check(host)
    assert after["newest_file"] == SPEC and after["files_changed"] > top["started"]
    (stale,) = [p for p in after["processes"] if p["pid"] == old.pid]
    assert stale["before_files"] is True
    doc = serve_plan.serving(after, "local")
    assert doc["state"] == "stale" and f"pid {old.pid} started before the last switch" in doc["explanation"]

    new = subprocess.Popen([host.python, "-c", "import time; time.sleep(60)"], start_new_session=True)
    reap.append(new.pid)
    os.killpg(old.pid, signal.SIGKILL)
    old.wait()
    time.sleep(0.3)
    now = check(host)
    assert [(p["pid"], p["before_files"]) for p in now["processes"]] == [(new.pid, False)]
    assert serve_plan.serving(now, "local")["state"] == "current"


def test_discover_finds_a_process_of_another_interpreter_working_in_the_package(env, reap):
    host, site = env
    other = subprocess.Popen(["sleep", "60"], cwd=site / "sglang", start_new_session=True)
    reap.append(other.pid)
    time.sleep(0.3)
    found = {p["pid"]: p for p in check(host)["processes"]}
    assert found[other.pid]["matched"] == ["cwd"]


# ---------------------------------------------------------------- restart, health, proof


def run(host: Host, s, *, proof=True, heartbeats=None, files=(SPEC,)):
    request = serve_plan.restart_request(host.python, list(files), s,
                                         proof=serve_plan.proof_spec(s) if proof else None,
                                         heartbeat_s=0.2)
    return serve_run.run_restart(host, LocalTransport(), request,
                                 heartbeat=(lambda what, sec: heartbeats.append((what, sec))) if heartbeats is not None
                                 else None)


def test_restart_health_and_the_tree_proof(env, tmp_path, reap):
    host, _site = env
    port = free_port()
    beats: list = []
    r = run(host, settings(port, launcher(tmp_path, host, port, "--ready-after", "1.0")), heartbeats=beats)
    reap.extend(pids_in(tmp_path, port))
    assert r.ok and r.state == "healthy" and r.failed is None, r.detail
    answer = r.answer
    assert answer["restart"]["rc"] == 0 and answer["health"]["status"] == 200 and answer["health"]["polls"] > 1
    assert answer["proof"]["tree"] == {"verify_width": 9, "budget": 8, "worker_class": "DFlashWorker",
                                       "offchain_accepts": answer["proof"]["tree"]["offchain_accepts"]}
    assert answer["proof"]["tree"]["offchain_accepts"] >= 1  # the tree prompts were sent (proof "tree")
    assert [p["pid"] for p in answer["after"]["processes"]] == pids_in(tmp_path, port)
    assert "DDTREE verify width 9 = budget 8 + 1, DFlashWorker" in r.detail
    assert any(what == "server health" for what, _s in beats)  # heartbeats during the readiness wait
    record = r.record("run1", "run2")
    assert (record["state"], record["run_id"], record["restart_run"], record["pids"]) == \
        ("healthy", "run1", "run2", pids_in(tmp_path, port))
    # The "width" proof reads /server_info only: nothing sent to the server.
    port2 = free_port()
    r = run(host, settings(port2, launcher(tmp_path, host, port2), proof="width"))
    reap.extend(pids_in(tmp_path, port2))
    assert r.ok and r.proof == "width" and "tree_requests" not in r.answer["proof"], r.detail


@pytest.mark.parametrize("mode, detail", [
    ("wrong-algo", "the server reports speculative_algorithm='DFLASH', not DDTREE"),
    ("block-width", "ddtree_verify_width is 16, expected 9 (budget 8 + 1)"),
])
def test_a_healthy_server_that_does_not_serve_the_tree_fails_the_proof(env, tmp_path, reap, mode, detail):
    host, _site = env
    port = free_port()
    r = run(host, settings(port, launcher(tmp_path, host, port, "--mode", mode)))
    reap.extend(pids_in(tmp_path, port))
    assert not r.ok and r.failed == "proof" and r.state == "unhealthy" and detail in r.detail, r.detail
    assert r.answer["health"]["status"] == 200


def test_restart_command_failures(env, tmp_path):
    host, _site = env
    port = free_port()
    r = run(host, settings(port, [sys.executable, "-c", "import sys; print('unit sglang not found'); sys.exit(5)"]))
    assert (r.ok, r.failed) == (False, "restart")
    assert r.detail == "the restart command exited 5: unit sglang not found"
    r = run(host, settings(port, [str(tmp_path / "no-such-program")]))
    assert r.failed == "restart" and "cannot run" in r.detail and "No such file" in r.detail
    r = run(host, settings(port, [sys.executable, "-c", "import time; time.sleep(30)"], restart_timeout_s=1))
    assert r.failed == "restart"
    assert r.detail == "the restart command did not finish within 1 s: its process group was killed (1 process)"


@pytest.mark.parametrize("step", ["restart", "drain"])
def test_a_command_past_its_timeout_is_killed_with_its_whole_process_group(env, tmp_path, step):
    """Each drain and restart command runs in a process group of its own; past its timeout the
    whole group is killed and reaped (not only its first process), and the failure says how
    many processes that was: nothing it started acts after the run."""
    host, _site = env
    port = free_port()
    pids, marker = tmp_path / "pids", tmp_path / "restarted-late"
    forking = forking_command(tmp_path, pids, marker)
    table = ({"restart": forking, "restart_timeout_s": 2} if step == "restart" else
             {"restart": ["true"], "drain": forking, "drain_timeout_s": 2})
    r = run(host, settings(port, **table), proof=False)
    assert r.failed == step, r.detail
    # the command, its late child, the inner child and its own child: 4 processes
    assert r.detail == f"the {step} command did not finish within 2 s: its process group was killed (4 processes)"
    assert r.answer[step]["killed"] == 4 and r.answer[step]["left"] == []
    started = [int(x) for x in pids.read_text().split()]
    assert len(started) == 3 and not any(_alive(pid) for pid in started)
    wait_past_the_late_moment(pids)  # past the moment the late child would have acted
    assert not marker.exists()


def test_not_healthy_in_time_and_an_old_process_still_serving(env, tmp_path, reap):
    host, _site = env
    port = free_port()
    r = run(host, settings(port, ["true"], ready_timeout_s=1))  # nothing answers there
    assert r.failed == "health" and r.state == "unhealthy"
    assert r.detail == "the server was not healthy 1 s after the restart (last health status none: nothing answered)"
    # A restart command that restarts nothing: the old server still answers 200, but it runs
    # the old code (it started before the restart): never taken as the restarted server.
    subprocess.run(launcher(tmp_path, host, port), check=True)
    time.sleep(1.0)
    reap.extend(pids_in(tmp_path, port))
    r = run(host, settings(port, ["true"], ready_timeout_s=1.5))
    assert r.failed == "health" and "processes started before the restart still serve: " \
        f"{pids_in(tmp_path, port)[0]}" in r.detail and r.answer["health"]["status"] == 200


def test_drain_runs_first_and_a_failed_drain_restarts_nothing(env, tmp_path, reap):
    host, _site = env
    port = free_port()
    marks = tmp_path / "marks"
    note = "import sys, time; open(sys.argv[1], 'a').write(sys.argv[2] + chr(10))"
    restart = [sys.executable, "-c", f"{note}; import subprocess, json; subprocess.Popen(json.loads(sys.argv[3]), "
               "start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)", str(marks), "restart",
               launcher(tmp_path, host, port)[3]]
    drain = [sys.executable, "-c", note, str(marks), "drain"]
    r = run(host, settings(port, restart, drain=drain, drain_wait_s=0.2), proof=False)
    reap.extend(pids_in(tmp_path, port))
    assert r.ok, r.detail
    assert marks.read_text().split() == ["drain", "restart"] and r.answer["drain"]["rc"] == 0
    marks.unlink()
    r = run(host, settings(port, restart, drain=[sys.executable, "-c", "raise SystemExit(3)"]), proof=False)
    assert (r.failed, r.detail) == ("drain", "the drain command exited 3: no output")
    assert not marks.exists()  # the restart never ran


def test_the_smoke_programs_own_probe_is_never_taken_for_a_server(env, tmp_path):
    """A probe the smoke program runs with the host's interpreter (here its cli level, held
    for a while) is ddtree-deploy's own: `status` lists it apart, never as a (stale) server."""
    from ddtree_deploy.remote.program import ProgramSession
    from ddtree_deploy.smoke.run import SMOKE_PROGRAM

    host, _site = env
    request = {"levels": ["cli"], "cli": {"argv": ["{python}", "-c", "import time; time.sleep(8)"], "expect": [],
                                          "timeout_s": 60}}
    with LocalTransport() as t, ProgramSession(t, host, SMOKE_PROGRAM) as smoke:
        smoke.send(request)
        deadline = time.monotonic() + 30
        while True:  # the probe runs (the smoke program's child, with the host's interpreter)
            answer = check(host)
            probes = [p for p in answer.get("own") or () if "time.sleep(8)" in " ".join(p["cmdline"])]
            if probes:
                break
            assert time.monotonic() < deadline, answer
            time.sleep(0.2)
        assert not any("time.sleep(8)" in " ".join(p["cmdline"]) for p in answer["processes"]), answer["processes"]
        (probe,) = probes
        assert probe["program"] == "smoke"
        doc = serve_plan.serving(answer, "local")
        assert f"pid {probe['pid']}: smoke" in doc["explanation"] and doc["state"] != "stale"
        while smoke.read(time.monotonic() + 30).get("event") != "done":
            pass


def test_a_health_url_that_answers_without_http_is_not_healthy_yet(env, tmp_path):
    """Whatever holds the port answers, but not with HTTP (http.client's BadStatusLine): not
    healthy (yet), the wait goes on to its deadline; the serve program never aborts on it."""
    import socket
    import threading

    host, _site = env
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def answer_garbage():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                conn.recv(4096)
                conn.sendall(b"SSH-2.0-OpenSSH_9.6 not http\r\n")
            finally:
                conn.close()

    thread = threading.Thread(target=answer_garbage, daemon=True)
    thread.start()
    try:
        r = run(host, settings(port, ["true"], ready_timeout_s=1.5), proof=False)
    finally:
        stop.set()
        thread.join()
        listener.close()
    assert (r.failed, r.state) == ("health", "unhealthy"), r.detail
    assert r.detail == ("the server was not healthy 1.5 s after the restart (last health status none: "
                        "nothing answered)"), r.detail
    assert r.answer["health"]["polls"] > 1
