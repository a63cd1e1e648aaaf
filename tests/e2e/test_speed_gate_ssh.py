"""The speed gate in push (issue 29 phase 2): a push is promoted only when the new code serves
no slower than the code it replaced, on the same host, under the same traffic.

Real parts: sandbox hosts over a real OpenSSH sshd on loopback (ddtree_deploy.sandbox), SGLang
0.5.12.post1's real files and the small real series (tests/sshd_host.py), the server under a
real supervisord (tests/serve_host.py), the serve program's ``metrics`` op, the controller's
parse and ``analysis.analyse``. The server is the named STAND-IN for SGLang
(ddtree_testkit/standin_server.py ``--enable-metrics``, its synthetic speed model and its own
clients as live traffic; no GPU here). Its "slow build": the series' added module carries the
stand-in's marker ``# ddtree-standin: slowdown=0.10`` (the stand-in reads that file at start),
so a server restarted on the pushed files serves 10% slower, as a real slower build would.

Windows are short (1 s, 4 a side) so the file stays fast; the gate's defaults are held to
their noise figures by tests/integration/test_analysis.py and bench/analysis_bench.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from envelope_check import check_envelope
from serve_host import Served
from sshd_host import ADDED, DEPLOY_SERIES, cli, series_covering_elsewhere, wait_stopped  # the sshd fixture: conftest.py's

from ddtree_testkit.machine import contention, settle, within
from ddtree_testkit.standin_metrics import write_names

pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in as a GPU host's would")
pytestmark = pytest.mark.sshd

RELEASE = "0.5.12.post1"
SLOW_MARK = "# ddtree-standin: slowdown=0.10\n"
# Short windows: 1 s each, 3 a side (the table's floor is a 1 s interval and 3 samples).
ANALYSIS = "\n[analysis]\nwindow_s = 3\ninterval_s = 1\nmin_samples = 3\n"


@pytest.fixture
def gate(sshd, tmp_path, monkeypatch):
    """``gate.host(name, noise=0.0)``: a Served host whose stand-in exports the pinned metrics of
    0.5.12.post1 with 4 synthetic clients, and whose inventory has [serve] and [analysis];
    ``gate.series(slow)``: the deploy series, or its slow build (the added module marked)."""
    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path / "snapshot"))
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(sshd.hosts_dir))
    names = tmp_path / "names.json"
    write_names(names, RELEASE)
    builds = {"equal": DEPLOY_SERIES}
    for name, line in (("slow", SLOW_MARK),):
        builds[name] = tmp_path / f"{name}_series"
        shutil.copytree(DEPLOY_SERIES, builds[name])
        with open(builds[name] / "payload" / "ddtree_deploy_test_marker.py", "a") as fh:
            fh.write(line)
    made: list[Served] = []

    class Gate:
        @staticmethod
        def series(build) -> None:
            """True: the slow build; False: the series as it is."""
            name = {True: "slow", False: "equal"}.get(build, build)
            monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(builds[name] / "patches"))

        @staticmethod
        def host(name: str, noise: float = 0.0, metrics: bool = True) -> Served:
            argv = ["--enable-metrics", "--metric-names", str(names), "--traffic", "4", "--traffic-tokens", "48",
                    "--accept-length", "3.0", "--noise", str(noise), "--noise-period-s", "1", "--seed",
                    str(len(made))] if metrics else []
            s = Served(sshd, tmp_path, name, extra_argv=argv, package_file=ADDED, tables=ANALYSIS)
            s.sup.start()
            made.append(s)
            s.wait_healthy()
            return s

    Gate.series(False)
    yield Gate
    for s in made:
        s.sup.stop()


def slowdown(s: Served) -> float:
    """The slowdown the serving stand-in runs with (read from its package file at start)."""
    return 0.10 if SLOW_MARK.strip() in (s.host.read(ADDED) or b"").decode() else 0.0


def history(s: Served) -> list[dict]:
    r = cli("history", "--host", s.name, "--json")
    return check_envelope(r.stdout, r.exit_code, "history")["hosts"][0]["entries"]


def test_a_slower_push_is_rolled_back_by_the_analysis_and_the_old_code_serves_again(gate):
    s = gate.host("slow1")
    gate.series(True)
    pid_before = s.sup.pid()
    r = cli("push", "--host", s.name)
    print(r.stdout)
    assert r.exit_code == 1, r.output
    assert "speed analysis: slower than the baseline: output tokens/s" in r.stdout, r.stdout
    assert "below the baseline's" in r.stdout and "(limit -5%" in r.stdout
    assert "rolled back:" in r.stdout and "restarted on the old files: healthy" in r.stdout
    # The old code serves again: the added module (the slow build) is gone, a new server runs.
    assert s.host.read(ADDED) is None and s.healthy() and s.sup.pid() != pid_before
    assert s.info()["stand_in_package"]["sha256"] is None
    journal = json.loads((s.host.state_dir / "journal.json").read_text())
    assert journal["phase"] == "rolled-back"
    entries = history(s)
    auto = next(e for e in entries if e["event"] == "rollback")["automatic"]
    assert auto["cause"] == "analysis" and auto["step"] == "fail" and "output tokens/s" in auto["detail"]
    verdict = next(e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "verdict")
    assert verdict["outcome"] == "rolled back" and verdict["speed"]["verdict"] == "fail"
    assert verdict["phase"] == "rolled-back"  # written once rolled back: the phase the host is in from it on
    assert verdict["speed"]["after"]["output_tps"] < 0.95 * verdict["speed"]["before"]["output_tps"]
    assert "windows" not in verdict["speed"]  # a rolled-back bake is never a later baseline

    # A server without --enable-metrics cannot be judged: the push is refused before its switch.
    bare = gate.host("bare1", metrics=False)
    r = cli("push", "--host", bare.name)
    assert r.exit_code == 1, r.output
    said = " ".join(r.output.split())
    assert "the speed analysis ([analysis]) cannot measure this server: " in said and "answered 404" in said, said
    assert "nothing was changed" in said and "or push with --no-analysis" in said, said
    assert bare.host.read(ADDED) is None and not (bare.host.state_dir / "journal.json").exists()

    # --no-analysis: the same slow build is promoted, and the outcome says the gate was skipped.
    r = cli("push", "--host", s.name, "--no-analysis")
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().splitlines()[-1] == f"{s.name}: speed analysis skipped (--no-analysis)", r.stdout
    assert slowdown(s) == 0.10 and s.info()["stand_in_package"]["sha256"] is not None


def test_an_equal_build_passes_every_time_with_the_noise_turned_up_and_history_shows_before_after(gate):
    s = gate.host("equal1", noise=0.05)
    for attempt in range(2):  # push (promoted), roll back (the old code), and again
        r = cli("push", "--host", s.name)
        print(r.stdout)
        assert r.exit_code == 0, (attempt, r.output)
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith(f"{s.name}: serving DDTree B=8: accept length") and last.endswith(": promoted"), last
        assert "(was " in last and "tok/s" in last
        assert slowdown(s) == 0.0 and s.host.read(ADDED) is not None
        rb = cli("rollback", "--host", s.name)
        assert rb.exit_code == 0, rb.output
        assert rb.stdout.strip().splitlines()[-1].startswith(f"{s.name}: serving DDTree B=8: accept length"), \
            rb.stdout
    entries = history(s)
    verdicts = [e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "verdict"]
    assert [e["outcome"] for e in verdicts] == ["promoted", "promoted"]
    assert [e["phase"] for e in verdicts] == ["deployed", "deployed"]  # written after the mark, never `switched`
    assert all(e["speed"]["before"]["output_tps"] and e["speed"]["after"]["output_tps"] for e in verdicts)
    assert len(verdicts[0]["speed"]["windows"]) == 3  # kept: the next push's baseline when its old server idles
    baselines = [e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "baseline"]
    assert len(baselines) == 2 and baselines[0]["speed"]["baseline"]["source"] == "live"
    # restart and rollback: one short window before and after each, said and in the history
    r = cli("restart", "--host", s.name)
    assert r.exit_code == 0, r.output
    assert f"{s.name}: serving DDTree B=8: accept length 3.0 (was 3.0)" in r.stdout, r.stdout
    entries = history(s)
    around = [e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "around"]
    assert [e["command"] for e in around] == ["restart", "rollback", "rollback"], around
    assert all(e["speed"]["before"]["output_tps"] and e["speed"]["after"]["output_tps"] for e in around)
    text = cli("history", "--host", s.name).stdout
    print(text)
    assert "speed" in text and "(was " in text and ": promoted" in text and "after: DDTree B=8" in text, text
    assert "promoted -> deployed" in text and "promoted -> switched" not in text, text


def test_a_server_that_dies_during_the_bake_is_rolled_back(gate):
    s = gate.host("dies1")
    first = s.sup.pid()

    def kill_after_restart() -> None:  # the new server: healthy, proven, then gone mid-bake
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            pid = s.sup.pid()
            if pid is not None and pid != first and s.healthy():
                time.sleep(1.5)
                subprocess.run([*s.sup.ctl, "stop", "sglang"], capture_output=True, timeout=60)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_after_restart, daemon=True)
    killer.start()
    r = cli("push", "--host", s.name)
    killer.join(5)
    print(r.stdout)
    assert r.exit_code == 1, r.output
    assert "speed analysis: the server stopped answering during the bake" in r.stdout, r.stdout
    assert "rolled back:" in r.stdout and "restarted on the old files: healthy" in r.stdout
    assert s.host.read(ADDED) is None and s.healthy()
    auto = next(e for e in history(s) if e["event"] == "rollback")["automatic"]
    assert auto["cause"] == "analysis" and auto["step"] == "server died"


def test_a_fleet_stops_after_a_failed_canary_analysis(gate):
    a, b = gate.host("canary1"), gate.host("wave1")
    gate.series(True)
    r = cli("push", "--host", a.name, "--host", b.name, "--canary", a.name, "--json")
    doc = check_envelope(r.stdout, r.exit_code, "push")
    assert r.exit_code == 1, r.output
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[a.name]["outcome"] == "failed, rolled back"
    speed = by[a.name]["serve"]["analysis"]
    assert speed["outcome"] == "rolled back" and speed["verdict"]["outcome"] == "fail"
    assert speed["verdict"]["baseline"]["output_tps"] and speed["verdict"]["new"]["output_tps"]
    assert by[b.name]["outcome"] == "skipped"  # never started: the canary failed
    # the outcome table (stderr): each host's baseline and new figures beside its outcome
    table = " ".join(r.stderr.split())
    print(r.stderr)
    assert "speed (baseline -> new)" in table and "tok/s (-" in table and ": rolled back" in table, r.stderr
    assert b.host.read(ADDED) is None and not (b.host.state_dir / "journal.json").exists()


def test_max_failures_counts_failed_analyses(gate):
    """``--max-failures 1``: a fleet goes on after one host whose analysis failed and stops after
    the second. The canary already serves the slow build (pushed with --no-analysis), so it
    ends `already deployed` and the waves start; then one host at a time (--parallel 1)."""
    canary, w1, w2, w3 = (gate.host(n) for n in ("mfcanary", "mf1", "mf2", "mf3"))
    gate.series(True)
    r = cli("push", "--host", canary.name, "--no-analysis")
    assert r.exit_code == 0 and slowdown(canary) == 0.10, r.output
    r = cli("push", *(a for h in (canary, w1, w2, w3) for a in ("--host", h.name)), "--canary", canary.name,
            "--parallel", "1", "--max-failures", "1", "--json")
    doc = check_envelope(r.stdout, r.exit_code, "push")
    print(r.stderr)
    assert r.exit_code == 1, r.output
    by = {h["host"]: h for h in doc["hosts"]}
    assert by[canary.name]["outcome"] == "already deployed", by[canary.name]["outcome"]
    for h in (w1, w2):  # each baked slower than its own baseline, rolled back, counted as a failure
        assert by[h.name]["outcome"] == "failed, rolled back", (h.name, by[h.name]["outcome"])
        verdict = by[h.name]["serve"]["analysis"]["verdict"]
        assert verdict["outcome"] == "fail" and verdict["new"]["output_tps"] < verdict["baseline"]["output_tps"]
        assert h.host.read(ADDED) is None and h.healthy()  # the old code serves again
    assert by[w3.name]["outcome"] == "skipped"  # never started: 2 failures > --max-failures 1
    assert w3.host.read(ADDED) is None and not (w3.host.state_dir / "journal.json").exists()
    said = " ".join(r.stderr.split())
    assert "2 host(s) failed (--max-failures 1)" in said and w3.name in said.split("not started:")[-1], said


def interrupted_within_a_second(proc: subprocess.Popen, during: str, busy: float) -> str:
    """Ctrl-C the running push: it must exit 130 within the toolkit's own second
    (ddtree_testkit.machine; ``busy``: its contention just before); returns its stderr."""
    t0 = time.monotonic()
    proc.send_signal(subprocess.signal.SIGINT)
    _out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    fast, said = within(took, 1.0, f"from Ctrl-C during {during} to the exit", busy)
    print(f"\nCtrl-C during {during}: exit {proc.returncode} after {took:.2f} s\n{err[-1500:]}")
    assert proc.returncode == 130 and fast, (proc.returncode, said, err[-2000:])
    return err


def test_ctrl_c_during_the_bake_returns_within_a_second_and_a_rerun_finishes_the_job(gate):
    """Ctrl-C while the new server bakes: exit 130 within a second (the toolkit's own second,
    ddtree_testkit.machine), the host left `switched` with the new server healthy and not
    promoted (status says so), and a rerun of push bakes it against the baseline this run
    recorded before its switch, and promotes it."""

    s = gate.host("ctrlc1")
    console = Path(sys.executable).parent / "ddtree-deploy"
    proc = subprocess.Popen([str(console), "push", "--host", s.name, "--analysis", "window_s=4"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    journal = s.host.state_dir / "journal.json"
    deadline = time.monotonic() + 60
    while True:  # restarted healthy on the new files: the bake's scrapes are under way
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        serve = json.loads(journal.read_text()).get("serve", {}) if journal.exists() else {}
        if serve.get("state") == "healthy":
            break
        time.sleep(0.1)
    err = interrupted_within_a_second(proc, "the bake", settle(1.0))
    assert "Traceback" not in err
    # switched, healthy on the new files, not promoted: what status explains
    st = check_envelope(cli("status", "--host", s.name, "--json").stdout, 1, "status")["hosts"][0]
    print(st["explanation"])
    assert st["phase"] == "switched" and st["serving"]["health"]["status"] == 200, st
    assert "healthy" in st["explanation"] and f"ddtree-deploy push --host {s.name}" in st["explanation"], st
    assert s.host.read(ADDED) is not None
    # the rerun: nothing to switch, the bake judged against this run's own baseline, promoted
    r = cli("push", "--host", s.name)
    print(r.stdout)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip().splitlines()[-1].endswith(": promoted"), r.stdout
    verdict = next(e for e in history(s) if e["event"] == "speed" and e["speed"]["stage"] == "verdict")
    assert verdict["speed"]["baseline_source"] == "live" and verdict["outcome"] == "promoted"
    assert json.loads(journal.read_text())["phase"] == "deployed"


def test_a_push_its_checks_refuse_measures_no_baseline(gate, tmp_path, monkeypatch):
    """A doomed push (here: a release no family covers; the driver check runs on the same
    read, before it) is refused in one line, exit 2, BEFORE the old server is measured: the
    baseline's windows would only make the refusal come seconds later."""
    s = gate.host("doomed1")
    monkeypatch.setenv("DDTREE_DEPLOY_PATCHES", str(series_covering_elsewhere(tmp_path)))
    r = cli("push", "--host", s.name)
    assert r.exit_code == 2, r.output
    assert "no family covers SGLang 0.5.12.post1" in r.stderr, r.stderr
    # no window taken: the progress line that starts the baseline never came (the old order:
    # "speed baseline: 3 windows of 1 s on the old server", then the refusal)
    assert "speed baseline:" not in r.output, r.output
    assert not (s.host.state_dir / "journal.json").exists()


# ---------------------------------------------------------------- the load step ([analysis.load])


def load_processes(root: Path) -> list[int]:
    """The load step's processes (marked for status: never a server) that THIS test started:
    run by the interpreter of its own host under ``root`` (the benchmark is ``{python} -m
    ...`` with the host program's interpreter; its workers are that interpreter too). Other
    tests on the machine, xdist's other workers and other checkouts run load steps of their
    own at the same time: theirs are not this test's to count. An orphan keeps its command
    line, so one the host program failed to stop is still found."""
    prefix = str(root).encode() + b"/"
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit():
                continue
            argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            if argv0.startswith(prefix) and b"DDTREE_DEPLOY_HOST_PROGRAM=load" in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def gone_within(root: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while load_processes(root):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def load_host(gate, sshd, tmp_path: Path, name: str) -> tuple[Served, Path, str]:
    """An idle Served host (no traffic of its own) in a release venv of SGLang 0.5.12.post1
    with ``[analysis.load]`` (8 prompts at concurrency 4, 32 output tokens): (it, its root,
    how its figures are said to be taken)."""
    from ddtree_deploy.sandbox import SandboxHost, hostenv
    from tune_host import make_model

    root = tmp_path / name
    env = hostenv.make_host_env(root / "env")
    host = SandboxHost(name=name, server=sshd, python=env.python, site=env.site_packages,
                       state_dir=root / "state")
    model = make_model(root / "model")  # the tokenizer the benchmark loads (the server's /v1/models id)
    names = tmp_path / f"{name}-names.json"
    write_names(names, RELEASE)
    prompt_file = tmp_path / f"{name}-prompts.jsonl"
    prompt_file.write_text("".join(json.dumps({"prompt": f"w{i} w{i + 1} w{i + 2} tok", "category": c}) + "\n"
                                   for i, c in enumerate(["chat", "code"] * 4)))
    load = f'\n[analysis.load]\nprompts = "{prompt_file}"\nconcurrency = 4\noutput_len = 32\n'
    s = Served(sshd, tmp_path, name, host=host, package_file=ADDED, tables=ANALYSIS + load,
               extra_argv=["--model-path", str(model), "--enable-metrics", "--metric-names", str(names),
                           "--accept-length", "3.0", "--noise", "0.0"])
    under = (f"under the load step (8 prompts of {prompt_file} at concurrency 4, 32 output tokens each "
             "(python -m sglang.bench_serving))")
    return s, root, under


def tree(*folders: Path) -> dict[str, float | None]:
    """Every path under ``folders`` (a folder that is not there: None), with its mtime."""
    out: dict[str, float | None] = {}
    for folder in folders:
        if not folder.exists():
            out[str(folder)] = None
            continue
        for p in folder.rglob("*"):
            out[str(p)] = p.lstat().st_mtime
    return out


@pytest.mark.sglang_env
def test_a_first_push_writes_nothing_on_the_host_before_its_lock(gate, sshd, tmp_path):
    """A host never pushed to, with [analysis.load]: the speed gate's baseline (the old server's
    windows, under SGLang's own benchmark) is taken before the push takes the deploy lock, so
    it must leave the host as it found it: no state folder made, no scratch file left, no
    bytecode written beside the release's files (its benchmark imports them). The host
    programs stop before each request (the test hook ``stop_before_each_request``); at the
    agent's ``lock`` the release venv and the state folder are compared with before the push."""
    s, root, _under = load_host(gate, sshd, tmp_path, "first1")
    s.sup.start()
    log = tmp_path / "stops.log"
    stopped = None
    try:
        s.wait_healthy()
        watched = (root / "env", s.host.state_dir)
        before = tree(*watched)
        assert before[str(s.host.state_dir)] is None  # a first push: no state folder yet
        console = Path(sys.executable).parent / "ddtree-deploy"
        env = dict(os.environ, DDTREE_DEPLOY_TEST_HOOKS=json.dumps({"stop_before_each_request": str(log)}))
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # a host's shell does not forbid bytecode: nor does the test's
        proc = subprocess.Popen([str(console), "push", "--host", s.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        seen, ops, at_lock = 0, [], None
        deadline = time.monotonic() + 300
        while True:
            lines = log.read_text().splitlines() if log.exists() else []
            if len(lines) == seen:
                if proc.poll() is not None:
                    break
                assert time.monotonic() < deadline, "the push did not end"
                time.sleep(0.02)
                continue
            pid, op = lines[seen].split()
            seen, stopped = seen + 1, int(pid)
            wait_stopped(stopped)
            ops.append(op)
            if op == "lock" and at_lock is None:
                at_lock = tree(*watched)  # the baseline, its load step and every check are done
            os.kill(stopped, signal.SIGCONT)
            stopped = None
        out, err = proc.communicate(timeout=60)
        print(err[-3000:], out)
        assert proc.returncode == 0, out + err
        assert "load step: the old server has no live traffic: the load step drives it" in err  # it ran
        assert at_lock is not None, ops
        assert at_lock == before, sorted(set(at_lock) ^ set(before)) or "modified before the lock"
    finally:
        if stopped is not None:
            os.kill(stopped, signal.SIGCONT)
        s.sup.stop()


@pytest.mark.sglang_env
def test_the_load_step_drives_an_idle_server_on_both_sides(gate, sshd, tmp_path):
    """An idle server (no traffic of its own) with [analysis.load]: SGLang 0.5.12.post1's OWN
    benchmark (python -m sglang.bench_serving, in the host's release venv) drives the old server
    during the baseline and the new one during the bake, with the operator's prompts; the
    figures are said and recorded as taken under it; nothing of it is left running. Then Ctrl-C
    during a slower build's bake: exit 130 within a second, the benchmark stopped on the host,
    status explains the host; the rerun bakes under the same load and rolls the slower build
    back. The server is the STAND-IN (its streamed /generate decodes through its speed model)."""
    s, root, under = load_host(gate, sshd, tmp_path, "load1")
    host = s.host
    s.sup.start()
    try:
        s.wait_healthy()
        r = cli("push", "--host", s.name)
        print(r.stderr[-3000:], r.stdout)
        assert r.exit_code == 0, r.output
        assert "load step: the old server has no live traffic: the load step drives it" in r.stderr
        last = r.stdout.strip().splitlines()[-1]
        assert last.startswith(f"{s.name}: serving DDTree B=8: accept length ") and last.endswith(
            f"{under}: promoted"), last
        entries = history(s)
        verdict = next(e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "verdict")
        assert verdict["speed"]["load"]["concurrency"] == 4 and verdict["speed"]["load"]["prompt_count"] == 8
        assert verdict["speed"]["before"]["output_tps"] and verdict["speed"]["after"]["output_tps"]
        baseline = next(e for e in entries if e["event"] == "speed" and e["speed"]["stage"] == "baseline")
        assert baseline["speed"]["baseline"]["load"]["module"] == "sglang.bench_serving"
        text = " ".join(cli("history", "--host", s.name).stdout.split())
        assert f"{under}: promoted" in text and "baseline (live): DDTree B=8" in text, text
        assert not load_processes(root)  # the benchmark's group, stopped and reaped
        assert not ((host.state_dir / "load").exists() and list((host.state_dir / "load").iterdir()))

        # Ctrl-C while the slower build's bake is under load (from the old code: rolled back first)
        assert cli("rollback", "--host", s.name).exit_code == 0
        gate.series(True)
        console = Path(sys.executable).parent / "ddtree-deploy"
        proc = subprocess.Popen([str(console), "push", "--host", s.name], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        journal = host.state_dir / "journal.json"
        deadline = time.monotonic() + 180
        while True:  # restarted on the new files, and the bake's benchmark runs
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            serve = json.loads(journal.read_text()).get("serve", {}) if journal.exists() else {}
            if serve.get("state") == "healthy" and json.loads(journal.read_text()).get("phase") == "switched" \
                    and load_processes(root):
                break
            time.sleep(0.1)
        # status meanwhile: the benchmark is the toolkit's own, never a server
        r = cli("status", "--host", s.name, "--json")  # (a push holds the lock: its exit is status' own)
        st = check_envelope(r.stdout, r.exit_code, "status")["hosts"][0]
        bench = set(load_processes(root))
        assert bench & {p["pid"] for p in st["serving"]["own"]}, (bench, st["serving"]["own"])
        assert all(p["program"] == "load" for p in st["serving"]["own"] if p["pid"] in bench)
        assert not bench & {pid for p in st["serving"]["processes"] for pid in [p["pid"], *(p.get("children") or [])]}
        assert ": load" in st["serving"]["explanation"], st["serving"]["explanation"]
        interrupted_within_a_second(proc, "the bake under load", contention())
        assert gone_within(root, 15), load_processes(root)  # the host program stopped the benchmark's group
        st = check_envelope(cli("status", "--host", s.name, "--json").stdout, 1, "status")["hosts"][0]
        assert st["phase"] == "switched" and st["serving"]["health"]["status"] == 200, st
        assert f"ddtree-deploy push --host {s.name}" in st["explanation"], st
        # the rerun: the bake under the load its baseline was taken with; slower: rolled back
        r = cli("push", "--host", s.name)
        print(r.stderr[-2000:], r.stdout)
        assert r.exit_code == 1, r.output
        said = " ".join(r.stdout.split())
        assert "speed analysis: slower than the baseline: output tokens/s" in said and under in said, said
        assert "rolled back:" in said and s.host.read(ADDED) is None and s.healthy()
        assert gone_within(root, 15), load_processes(root)
    finally:
        s.sup.stop()
