"""The speed gate's load step (``[analysis.load]``) without a host: the decision (an idle old
server is driven, one with live traffic is not, and that is said), the benchmark it runs
(tune's own argv parts, exact), what the baseline, the bake and the history keep of it, and
a rerun's load rebuilt from the record. Then the host side (hostprog/load.py) run here as the
serve program runs it, with a named STAND-IN for SGLang's benchmark (a short script that prints
the benchmark's ready line and waits: SGLang's real benchmark drives the stand-in server over
real sshd in tests/e2e/test_speed_gate_ssh.py::test_the_load_step_drives_an_idle_server_on_both_sides):
the whole group stopped and reaped when the scrapes end and when the controller's end of the
link closes, a benchmark that fails before it sends said in one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ddtree_deploy.sandbox.hostenv import make_python_env
from ddtree_deploy.serve import bake, loadstep
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.settings.analysis import AnalysisSettings, LoadStep, parse_analysis
from ddtree_deploy.tuning import prompts, run as tune_run

REPO = Path(__file__).resolve().parent.parent.parent
LOAD = LoadStep(prompts="prompts/chat.jsonl", concurrency=4, output_len=32)
SAMPLE = prompts.parse_jsonl("\n".join(json.dumps({"prompt": f"tell me about w{i}", "category": c})
                                       for i, c in enumerate(["chat", "code", "chat"])), source="prompts/chat.jsonl")
BUSY = ServedFigures(window_s=1.0, release="0.5.12.post1", output_tps=500.0, running=4, requests=10, request_rate=10.0)
IDLE = ServedFigures(window_s=1.0, release="0.5.12.post1", running=0, requests=0, aborted=0)


# ---------------------------------------------------------------- the decision


def test_an_idle_server_with_a_load_step_is_driven():
    d = loadstep.decide(LOAD, IDLE)
    assert d.drive and d.why == "the old server has no live traffic: the load step drives it"


def test_live_traffic_is_measured_as_it_is_and_the_load_step_says_it_did_not_run():
    d = loadstep.decide(LOAD, BUSY)
    assert not d.drive
    assert d.why == ('the old server has live traffic (4 running, 10.0 req/s): the load step is not run '
                     '(when = "idle"): its own traffic is measured')


def test_when_always_drives_even_a_busy_server_and_no_table_never_drives():
    assert loadstep.decide(LoadStep(prompts="p", when="always"), BUSY).drive
    assert not loadstep.decide(None, IDLE).drive
    gone = loadstep.decide(LOAD, Unavailable("http://127.0.0.1:1/metrics: nothing answered"))
    assert not gone.drive and "could not be read (http://127.0.0.1:1/metrics: nothing answered)" in gone.why


# ---------------------------------------------------------------- the benchmark it runs


def test_the_plan_is_tunes_benchmark_with_the_operators_prompts():
    p = loadstep.plan(LOAD, SAMPLE, url="http://127.0.0.1:30000", module="sglang.benchmark.serving", why="idle")
    assert list(p.argv) == ["{python}", "-m", "sglang.benchmark.serving", "--backend", "sglang", "--host",
                            "127.0.0.1", "--port", "30000", "--seed", "1", "--request-rate", "inf", "--flush-cache",
                            "--disable-tqdm", "--ready-check-timeout-sec", "0", "--warmup-requests", "1",
                            "--dataset-name", "custom", "--sharegpt-output-len", "32"]
    # tune's own parts, not a copy of them
    assert list(p.argv) == tune_run.server_bench_argv("127.0.0.1", 30000, "sglang.benchmark.serving") \
        + tune_run.prompts_dataset_args(32)
    assert p.text == prompts.custom_lines([x.text for x in SAMPLE.prompts])  # every category, one file
    assert p.count == 3 and p.requests == 4 * loadstep.REQUESTS_PER_SLOT
    with_tok = loadstep.plan(LoadStep(prompts="p", tokenizer="/models/llama"), SAMPLE, url="http://10.0.0.5:8000/",
                             module="sglang.bench_serving")
    assert with_tok.argv[with_tok.argv.index("--tokenizer") + 1] == "/models/llama"
    assert with_tok.argv[with_tok.argv.index("--host") + 1] == "10.0.0.5"
    request = p.request("20261202T150000-1-1")
    assert request["tag"] == "20261202T150000-1-1" and request["concurrency"] == 4
    assert "state_dir" not in request  # the host's state is not the load step's: it runs before the lock
    assert loadstep.requests_for(50_000, 4) == 50_000 and loadstep.requests_for(3, 4096) == loadstep.MAX_REQUESTS


def test_a_rerun_rebuilds_the_same_load_and_refuses_a_changed_one():
    p = loadstep.plan(LOAD, SAMPLE, url="http://127.0.0.1:30000", module="sglang.bench_serving")
    again = loadstep.from_record(json.loads(json.dumps(p.record())), LOAD, SAMPLE, url="http://127.0.0.1:30000")
    assert again.argv == p.argv and again.module == "sglang.bench_serving"
    with pytest.raises(loadstep.LoadFailed, match=r"changed since the baseline was taken \(concurrency\)"):
        loadstep.from_record(p.record(), LoadStep(prompts="p", concurrency=8, output_len=32), SAMPLE,
                             url="http://127.0.0.1:30000")
    with pytest.raises(loadstep.LoadFailed, match="is gone"):
        loadstep.from_record(p.record(), None, None, url="http://127.0.0.1:30000")


def test_output_len_under_4_is_refused_as_sglangs_custom_dataset_refuses_it():
    from ddtree_deploy.base.errors import BadInput

    with pytest.raises(BadInput, match="analysis.load.output_len"):
        parse_analysis({"load": {"prompts": "p.jsonl", "output_len": 3}}, source="hosts/h.toml")
    got = parse_analysis({"load": {"prompts": "p.jsonl", "tokenizer": "/models/x"}}, source="hosts/h.toml")
    assert got.load.tokenizer == "/models/x"


# ---------------------------------------------------------------- what is kept and said


def busy(tps: float, n: int) -> list:
    return [ServedFigures(window_s=1.0, release="0.5.12.post1", algorithm="DDTREE", budget=8, accept_length=3.0,
                          output_tps=tps * (1 + 0.004 * ((i % 3) - 1)), running=4, requests=10, aborted=0,
                          request_rate=10.0, error_rate=0.0) for i in range(n)]


def test_the_bake_and_the_history_say_the_figures_were_taken_under_the_load_step():
    settings = AnalysisSettings(window_s=4, interval_s=1, min_samples=3)
    p = loadstep.plan(LOAD, SAMPLE, url="http://127.0.0.1:30000", module="sglang.bench_serving")
    base = bake.measure_baseline(lambda i, n: busy(500, n - 1), settings, load=p)
    assert base.load == p.record() and base.plan is p and "under the load step (3 prompts of" in base.note
    doc = base.to_json()
    assert doc["load"]["concurrency"] == 4 and bake.Baseline.from_json(doc).load == p.record()
    done = bake.bake(lambda i, n: busy(500, n - 1), settings, base)
    under = ("under the load step (3 prompts of prompts/chat.jsonl at concurrency 4, 32 output tokens each "
             "(python -m sglang.bench_serving))")
    assert done.ok and done.line().endswith(f"{under}: promoted"), done.line()
    record = done.record()
    assert record["load"]["prompts"] == "prompts/chat.jsonl" and done.to_json()["load"]["concurrency"] == 4
    assert bake.entry_words({"stage": "baseline", "baseline": doc}).endswith(under)
    # a later push whose old server idles judges against this bake: still said to be under load
    found = bake.recorded_baseline([{"event": "speed", "run_id": "r1", "time": "t", "speed": record}])
    assert found.load == p.record() and under in found.note
    slower = bake.bake(lambda i, n: busy(400, n - 1), settings, base)
    assert not slower.ok and slower.line().endswith(under)
    failed = bake.Bake(base, load_failed="the benchmark exited 1")
    assert not failed.ok and failed.cause == "load step failed"
    assert failed.why() == "not judged: the load step failed during the bake: the benchmark exited 1"


def test_a_live_traffic_baseline_says_why_the_load_step_did_not_run():
    settings = AnalysisSettings(window_s=4, interval_s=1, min_samples=3)
    why = loadstep.decide(LOAD, BUSY).why
    base = bake.measure_baseline(lambda i, n: busy(500, n - 1), settings, not_driven=why)
    assert base.load is None and base.note.endswith(f"({why})")


# ---------------------------------------------------------------- the host side (hostprog/load.py)

# A STAND-IN for SGLang's benchmark (not it): prints its ready line, forks a worker into its
# process group as the real one's tokenizer pool may, and sends nothing (the scrapes are of a
# server this test does not run: their answer is not what is checked here).
FAKE_BENCH = textwrap.dedent('''
    import subprocess, sys, time
    mode = sys.argv[1]
    if mode == "fail":
        print("ValueError: output_len too small", flush=True)
        sys.exit(1)
    import importlib.util, os  # as the real one imports the installed SGLang (bytecode, were it let)
    found = os.path.join(os.path.dirname(importlib.util.find_spec("sglang").origin), "version.py")
    spec = importlib.util.spec_from_file_location("sglang_version", found)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    open(sys.argv[2] + ".sglang", "w").write(found)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[2], "a").write("%d %d\\n" % (__import__("os").getpid(), worker.pid))
    print("Starting main benchmark run...", flush=True)
    time.sleep(600)
''')


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def metrics_url():
    """A server answering ``/metrics`` (an empty exposition): the scrapes go on until stopped."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def serve_program(tmp_path: Path, mode: str, *, scrapes: int = 2,
                  url: str = "http://127.0.0.1:9") -> tuple[subprocess.Popen, dict, Path]:
    script = tmp_path / "fake_bench.py"
    script.write_text(FAKE_BENCH)
    pids = tmp_path / "pids"
    load = {"argv": ["{python}", str(script), mode, str(pids)], "prompts": prompts.custom_lines(["a b", "c d"]),
            "requests": 4, "concurrency": 2, "tag": "t1",
            "ready_timeout_s": 30, "settle_s": 0, "term_grace_s": 2}
    request = {"op": "metrics", "python": sys.executable, "url": url, "interval_s": 0.5,
               "scrapes": scrapes, "timeout_s": 1, "names": [], "load": load, "heartbeat_s": 1}
    # The host's interpreter: one with SGLang's files; its temp folder this test's own (the
    python, _site = make_python_env(tmp_path / "env", ["sglang/version.py"])
    # scratch folder is looked for there). A host's shell does not forbid bytecode: nor does this.
    (tmp_path / "tmp").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen([str(python), "-m", "ddtree_deploy.hostprog.serve"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
                            env={**env, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path / "tmp")})
    proc.stdin.write((json.dumps(request) + "\n").encode())
    proc.stdin.flush()
    return proc, request, pids


def answer_of(proc: subprocess.Popen) -> dict:
    out = proc.stdout.read().decode()
    proc.wait(timeout=30)
    return [json.loads(line) for line in out.splitlines()][-1]


def test_the_host_side_stops_the_whole_group_when_the_controller_goes(tmp_path, metrics_url):
    proc, _, pids = serve_program(tmp_path, "ok", scrapes=1000, url=metrics_url)
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text().strip()):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    bench, worker = map(int, pids.read_text().split())
    (scratch,) = (tmp_path / "tmp").iterdir()
    assert scratch.name.startswith("ddtree-deploy-load-t1-") and scratch.stat().st_mode & 0o777 == 0o700
    assert (scratch / "prompts.jsonl").read_text().count("\n") == 4  # cycled to 4
    assert b"PYTHONDONTWRITEBYTECODE=1" in Path(f"/proc/{bench}/environ").read_bytes().split(b"\0")
    environ = Path(f"/proc/{bench}/environ").read_bytes().split(b"\0")
    assert b"DDTREE_DEPLOY_HOST_PROGRAM=load" in environ  # never a server to status
    time.sleep(0.5)
    t0 = time.monotonic()
    proc.stdin.close()  # the controller's end of the link: Ctrl-C, a cut connection
    doc = answer_of(proc)
    took = time.monotonic() - t0
    assert took < 5, took
    assert not alive(bench) and not alive(worker)  # the whole group, reaped
    assert doc["load"]["killed"] == 2 and doc["load"]["left"] == [] and doc["load"]["ready_s"] is not None
    assert doc["metrics"] == "stopped" and "the controller went away" in doc["detail"]
    assert not list((tmp_path / "tmp").iterdir())  # the operator's prompts not left behind


def test_the_host_side_writes_nothing_but_its_scratch_folder(tmp_path):
    """It runs before a push's lock: no state folder made, no bytecode beside SGLang's files."""
    proc, _, pids = serve_program(tmp_path, "ok")
    doc = answer_of(proc)
    env = tmp_path / "env"
    # it ran, and imported SGLang's files from the host's release
    assert doc["load"]["error"] is None and pids.exists(), doc
    assert Path(pids.read_text() and str(pids) + ".sglang").read_text().startswith(str(env))
    assert not (tmp_path / "state").exists() and not list((tmp_path / "tmp").iterdir())
    assert not list(env.rglob("__pycache__")), list(env.rglob("__pycache__"))


def test_the_host_side_stops_the_benchmark_when_the_scrapes_end(tmp_path):
    proc, _, pids = serve_program(tmp_path, "ok", scrapes=2)
    doc = answer_of(proc)  # the scrapes of a server nobody runs stop at once: the load with them
    bench, worker = map(int, pids.read_text().split())
    assert not alive(bench) and not alive(worker) and doc["load"]["killed"] == 2
    assert doc["metrics"] == "unreachable"


def test_a_benchmark_that_fails_before_it_sends_is_one_line(tmp_path):
    proc, _, _ = serve_program(tmp_path, "fail")
    doc = answer_of(proc)
    assert doc["load"]["error"] == ("the benchmark exited 1 before it sent a measured request: "
                                    "ValueError: output_len too small")
    assert doc["metrics"] == "stopped" and doc["scrapes"] == []
