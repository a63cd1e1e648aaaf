"""`ddtree-deploy tune` end to end: a real sshd on loopback, a host Python with the real
SGLang 0.5.12.post1 release and the real DDTree series pushed, and SGLang's OWN
``python -m sglang.bench_serving`` from that release driving the load.

The server is ddtree_testkit/standin_tune_server.py, a STAND-IN for SGLang's server (no GPU here):
its throughput and accept length follow the synthetic model documented there, so the
sweep's choice is known in advance. The tokenizer bench_serving loads is a real
``transformers`` fast tokenizer built here (a word-level vocabulary; no download).

Each bench_serving run starts SGLang's interpreter (torch and transformers imports: 10-20
s on two shared cores), so the grids here are small. The host, the model and the helpers are
tests/tune_host.py's; the same on SGLang 0.5.23 (the v2 family) is
tests/e2e/test_tune_v2_family_ssh.py, apart so that a parallel run takes the two hosts' sweeps on
two workers at once.
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from envelope_check import check_envelope  # tests/envelope_check.py: the --json contract
from ddtree_deploy.sandbox import free_port
from ddtree_testkit.machine import settle, within
from tune_host import (alive, launch_table, pids, proc_start, prompt_file, run_cli, start_cli, tune_args,
                       wait_for, write_inventory)

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]


def bytecode_of(site) -> set[str]:
    """Every bytecode file under the host's site-packages."""
    return {str(p) for p in site.rglob("*.pyc")}


def test_sweep_chooses_the_model_optimum_records_an_oom_and_applies(tuned_host, tmp_path):
    h = tuned_host
    cached = bytecode_of(h["test_host"].site)
    pid_file = tmp_path / "server.pids"
    # Budget 32 "does not fit": the stand-in exits at start with CUDA's OOM message.
    inventory, port = write_inventory(h, ["--oom-budget", "32", "--pid-file", str(pid_file)])
    original = inventory.read_text()
    out = tmp_path / "out"
    started = time.monotonic()
    proc = run_cli(["tune", "--host", str(inventory), "--baseline", "dflash", "--budgets", "2,8,32",
                    "--topk", "2", "--concurrency", "4", "--requests", "8", "--input-len", "16",
                    "--output-len", "32", "--repeats", "0", "--out", str(out), "--apply", "--json"])
    seconds = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    # SGLang's bench_serving imported the release four times: no bytecode written beside it
    # (the host's files are a push's alone; tune runs without the deploy lock)
    assert bytecode_of(h["test_host"].site) == cached, sorted(bytecode_of(h["test_host"].site) - cached)[:5]
    doc = check_envelope(proc.stdout, proc.returncode, "tune")  # docs/json-schema.json (test_json_envelope.py)
    doc = doc["hosts"][0]  # the sweep of that host, in its entry
    runs = [(r["config"], r["stage"], r["status"]) for r in doc["runs"]]
    # The baseline, the coarse budgets (2 and 32: every other budget, both ends kept), then
    # the budget skipped next to the best (8). (The noise repeats are tested in test_tune.py:
    # each run here costs a bench_serving start, 10-20 s on this machine.)
    assert runs == [("dflash", "baseline", "ok"), ("ddtree-b2-k2", "coarse", "ok"),
                    ("ddtree-b32-k2", "coarse", "failed"), ("ddtree-b8-k2", "refine", "ok")], runs
    failed = doc["runs"][2]
    assert failed["error"].startswith("OOM: the server exited with code 1 before it was ready"), failed
    assert doc["failed"] == ["ddtree-b32-k2"]
    choice = doc["choice"]
    # The model: B=8 K=2 ~ +19% over the DFlash chain, ~+30% over B=2 (ddtree_testkit/standin_tune_server.py).
    assert (choice["best"], choice["budget"], choice["topk"]) == ("ddtree-b8-k2", 8, 2)
    assert choice["gain_pct"] > 5
    # The runner-up is B=2 (~30% behind), unless a loaded machine's timing pushed its p99 ITL past
    # the baseline's margin: then it is excluded, and the choice says so by name.
    excluded = {e["config"]: e["why"] for e in choice["excluded"]}
    if choice["second"] is None:
        assert excluded["ddtree-b2-k2"].startswith("p99 ITL "), choice
    else:
        assert choice["second"] == "ddtree-b2-k2" and choice["margin_pct"] > 10, choice
    assert choice["noise_pct"] is None  # --repeats 0: said so, never invented
    ranked = [row["config"] for row in doc["ranking"]["4"]]
    assert ranked[0] == "ddtree-b8-k2" and ranked[-1] == "ddtree-b32-k2"
    top = doc["ranking"]["4"][0]
    assert top["ratio"]["dflash"] > 1.05
    for key in ("output_tps", "request_tps", "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms"):
        assert top[key] > 0, key
    # Mean accept length from /server_info (the model: B=8 K=2 -> 2.77; sampled).
    assert 2.0 < top["accept_length"] < 3.5
    # Results file: header, then one line per finished configuration, in order.
    lines = (out / "results.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["kind"] == "header" and len(lines) == 1 + len(runs) + 1
    closing = json.loads(lines[-1])  # the summary: the best at the one concurrency, the schedule it implies
    # (the payload's schedule: its first threshold is 1, so one concurrency is one entry for every batch)
    assert closing["kind"] == "summary" and closing["schedule"] == "1:8/2" == doc["schedule"]
    png = (out / "tune.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    # --apply: budget and topk written, everything else of the file kept byte for byte.
    assert doc["apply"]["written"] and "+budget = 8" in doc["apply"]["diff"] and doc["apply"]["as"] == "budget"
    assert doc["apply"]["why_as"] == ("auto: the same configuration is fastest at every concurrency swept: the "
                                      "choice at concurrency 4")
    after = inventory.read_text()
    assert after == original.replace("budget = 64   # what the host runs today",
                                     "budget = 8   # what the host runs today").rstrip("\n") + "\ntopk = 2\n" \
        or after == original.replace("budget = 64   # what the host runs today",
                                     "budget = 8   # what the host runs today").replace(
                                         "term_grace_s = 3\n", "term_grace_s = 3\ntopk = 2\n")
    assert "--apply:" in proc.stderr and "-budget = 64" in proc.stderr
    # Nothing left running; the tune lock released; only tune/ added to the state dir.
    for pid in pids(pid_file):
        assert not alive(pid), pid
    state = h["test_host"].state_dir
    assert not (state / "tune" / "lock").exists()
    print(f"\ntune sweep: {len(runs)} launches in {seconds:.0f} s")


def test_killed_controller_stops_the_server_and_resume_skips_finished_runs(tuned_host, tmp_path):
    """SIGKILL of the controller mid-sweep: the host program sees its connection close and
    stops the server; --resume reruns only what had not finished. The resumed run's
    configuration dies mid-benchmark (the stand-in's OOM-killer knob): recorded failed."""
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--crash-budget", "16", "--pid-file", str(pid_file)])
    out = tmp_path / "out"
    results = out / "results.jsonl"
    proc = start_cli(tune_args(inventory, out))
    try:
        # The baseline finished (its line is in the results), the next server is up: kill.
        wait_for(lambda: results.exists() and len(results.read_text().splitlines()) == 2, 300, "the baseline")
        wait_for(lambda: len(pids(pid_file)) == 2, 60, "the second server")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    second = pids(pid_file)[1]
    wait_for(lambda: not alive(second), 30, "the host program to stop the server")
    state = h["test_host"].state_dir
    wait_for(lambda: not (state / "tune" / "lock").exists(), 30, "the tune lock to be released")
    assert [json.loads(x)["config"] for x in results.read_text().splitlines()[1:]] == ["none"]

    resumed = run_cli(tune_args(inventory, out, "--resume", "--json"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    doc = json.loads(resumed.stdout)["hosts"][0]
    assert doc["resumed"] == 1 and "resume: 1 finished run(s)" in resumed.stderr
    assert [(r["config"], r["status"]) for r in doc["runs"]] == [("none", "ok"), ("ddtree-b16-k2", "failed")]
    crash = doc["runs"][1]["error"]
    assert "the server exited with code 137 during the benchmark at concurrency 2" in crash, crash
    assert crash.startswith("OOM: ")  # the log says "Killed"
    assert doc["choice"]["best"] is None  # nothing qualified: the inventory would stay as it is
    for pid in pids(pid_file):
        assert not alive(pid), pid


def test_ctrl_c_stops_the_server_and_releases_the_lock(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--pid-file", str(pid_file)])
    state = h["test_host"].state_dir
    # A tune lock left by a dead process (a tune killed with its host program): taken over.
    lock = state / "tune" / "lock"
    lock.mkdir(parents=True)
    (lock / "owner.json").write_text(json.dumps({"run_id": "dead1", "host": os.uname().nodename,
                                                 "pid": 2 ** 22 + 7, "pid_start": "1"}))
    proc = start_cli(tune_args(inventory, tmp_path / "out"))
    try:
        wait_for(lambda: pids(pid_file), 120, "the server")
        busy = settle(1.0)
        t0 = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C at the terminal: the whole foreground group
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, err[-3000:]
    # #22: the prompt comes back within a second (of the toolkit's own, on top of what this
    # machine needs now for a Python process of the CLI's size to exit: ddtree_testkit.machine)
    fast, said = within(took, 1.0, "from Ctrl-C to the exit", busy)
    assert fast, said
    assert "took over a stale tune lock (run dead1" in err
    assert "interrupted: stopping the server on the host" in err
    for pid in pids(pid_file):
        wait_for(lambda: not alive(pid), 20, f"server {pid} to stop")
    wait_for(lambda: not lock.exists(), 20, "the tune lock to be released")


def test_locks_refuse_before_anything_launches(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--pid-file", str(pid_file)])
    state = h["test_host"].state_dir
    # A push holds the deploy lock (the agent's own lock layout).
    deploy_lock = state / "lock"
    deploy_lock.mkdir()
    (deploy_lock / "owner.json").write_text(json.dumps({"run_id": "r-push", "holder": "alice@laptop",
                                                        "command": "push", "time": "2026-11-30T12:00:00Z"}))
    try:
        proc = run_cli(tune_args(inventory, tmp_path / "out1"))
    finally:
        deploy_lock.joinpath("owner.json").unlink()
        deploy_lock.rmdir()
    assert proc.returncode == 1 and "a push holds the deploy lock (holder alice@laptop" in proc.stderr
    # Another tune holds the tune lock (a live process on this machine: this test).
    lock = state / "tune" / "lock"
    lock.mkdir(parents=True, exist_ok=True)
    (lock / "owner.json").write_text(json.dumps({"run_id": "t-other", "holder": "bob@ops", "command": "tune",
                                                 "host": os.uname().nodename, "pid": os.getpid(),
                                                 "pid_start": proc_start(os.getpid()), "time": "now"}))
    try:
        proc = run_cli(tune_args(inventory, tmp_path / "out2"))
    finally:
        (lock / "owner.json").unlink()
        lock.rmdir()
    assert proc.returncode == 1 and "another tune holds the tune lock (holder bob@ops" in proc.stderr
    assert not pid_file.exists()  # nothing launched
    assert not (tmp_path / "out1").exists() and not (tmp_path / "out2").exists()  # nothing written


def test_no_ddtree_deployed_is_bad_input(sshd, tuned_host, tmp_path):
    fresh = sshd.add_host("fresh", tmp_path / "fresh", files=["sglang/srt/speculative/spec_info.py"])
    inventory = fresh.inventory(tmp_path / "hosts")
    inventory.write_text(inventory.read_text() + launch_table(tuned_host["model"], free_port(), []))
    proc = run_cli(tune_args(inventory, tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    assert "fresh: no DDTree deployed (phase never-deployed)" in proc.stderr
    assert proc.stderr.count("error:") == 1 and not (fresh.state_dir / "tune").exists()


def test_a_busy_port_stops_the_sweep_instead_of_failing_every_launch(tuned_host, tmp_path):
    """Something else answers on the launch port: probing it would measure the wrong server,
    and every later launch would fail the same way, so the sweep stops there (exit 1)."""
    import socket

    h = tuned_host
    pid_file = tmp_path / "server.pids"
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        inventory, port = write_inventory(h, ["--pid-file", str(pid_file)], port=busy.getsockname()[1])
        proc = run_cli(tune_args(inventory, tmp_path / "out", "--json"))
    assert proc.returncode == 1, proc.stderr[-2000:]
    doc = check_envelope(proc.stdout, proc.returncode, "tune")["hosts"][0]
    assert doc["ok"] is False  # the sweep stopped: the host's entry says so, as the exit code
    assert [(r["config"], r["status"]) for r in doc["runs"]] == [("none", "failed")]
    assert f"port {port} on 127.0.0.1 is already in use" in doc["stopped"] and not pid_file.exists()


def test_sharegpt_file_missing_on_the_host_is_bad_input(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--pid-file", str(pid_file)])
    missing = tmp_path / "no-such-sharegpt.json"
    proc = run_cli(tune_args(inventory, tmp_path / "out", "--dataset", f"sharegpt-file={missing}"))
    assert proc.returncode == 2, proc.stderr
    assert f"--dataset sharegpt-file: {missing} is not a file on the host" in proc.stderr
    assert proc.stderr.count("error:") == 1 and not pid_file.exists()
    assert not (h["test_host"].state_dir / "tune" / "lock").exists()
    assert not (tmp_path / "out").exists()  # nothing written locally either


# ---------------------------------------------------------------- the operator's prompts


def test_prompt_file_per_category_and_the_best_at_every_concurrency(tuned_host, tmp_path):
    """0.5.12.post1: its benchmark is sglang.bench_serving (no sglang/benchmark/serving.py in
    that release). Each concurrency runs the benchmark once per category on SGLang's own
    ``custom`` dataset; the table gives each category's tokens/s and accept length (the
    probe), and the best configuration at every concurrency, whose schedule lands in the
    results. The tune stand-in's model (ddtree_testkit/standin_tune_server.py): at one
    request B=16 wins (deeper tree, +15% over the chain), at eight B=4 (cheaper steps)."""
    h = tuned_host
    inventory, _ = write_inventory(h, ["--accept-bonus", "w299=0.8"])
    out = tmp_path / "out"
    proc = run_cli(["tune", "--host", str(inventory), "--prompts", str(prompt_file(tmp_path / "p.jsonl")),
                    "--baseline", "dflash", "--budgets", "4,16", "--topk", "2", "--concurrency", "1,8",
                    "--requests", "8", "--output-len", "24", "--repeats", "0", "--out", str(out), "--json"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "benchmark: python -m sglang.bench_serving; prompts: " in proc.stderr
    doc = check_envelope(proc.stdout, proc.returncode, "tune")["hosts"][0]
    assert doc["dataset_label"] == f"prompts: {tmp_path / 'p.jsonl'} (chat 4, code 4 per run)"
    assert [(r["config"], r["status"]) for r in doc["runs"]] == [("dflash", "ok"), ("ddtree-b4-k2", "ok"),
                                                                ("ddtree-b16-k2", "ok")]
    for conc in ("1", "8"):
        for row in doc["ranking"][conc]:
            cats = row["categories"]
            assert sorted(cats) == ["chat", "code"] and all(cats[c]["completed"] == 4 for c in cats), row
            # the whole is the parts together: all their tokens over all their time
            together = sum(c["output_tokens"] for c in cats.values()) / sum(c["duration_s"] for c in cats.values())
            assert row["output_tps"] == pytest.approx(together)
    b16 = next(r for r in doc["runs"] if r["config"] == "ddtree-b16-k2")
    # The probe: code's prompts accept more per step than chat's (the model: +0.8).
    assert b16["category_accept"]["code"] > b16["category_accept"]["chat"] + 0.3, b16["category_accept"]
    best = {row["concurrency"]: row["config"] for row in doc["best_per_concurrency"]}
    assert best == {1: "ddtree-b16-k2", 8: "ddtree-b4-k2"}, doc["best_per_concurrency"]
    assert doc["schedule"] == "1:16/2,8:4/2"
    closing = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert closing["kind"] == "summary" and closing["schedule"] == "1:16/2,8:4/2"
    # The same sweep's table, as printed without --json (from the results file: no new launch).
    again = run_cli(["tune", "--host", str(inventory), "--prompts", str(tmp_path / "p.jsonl"), "--baseline", "dflash",
                     "--budgets", "4,16", "--topk", "2", "--concurrency", "1,8", "--requests", "8", "--output-len",
                     "24", "--repeats", "0", "--out", str(out), "--resume"])
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: 3 finished run(s)" in again.stderr and "launch" not in again.stderr
    text = again.stdout
    assert text.splitlines()[0] == f"prompts: {tmp_path / 'p.jsonl'} (chat 4, code 4 per run)"
    assert "chat tok/s" in text and "code tok/s" in text
    assert "best per concurrency (schedule 1:16/2,8:4/2):" in text
    print("\n" + text)


def test_apply_as_schedule_on_a_v1_family_is_bad_input_before_any_launch(tuned_host, tmp_path):
    h = tuned_host
    pid_file = tmp_path / "server.pids"
    inventory, _ = write_inventory(h, ["--pid-file", str(pid_file)])
    before = inventory.read_text()
    proc = run_cli(tune_args(inventory, tmp_path / "out", "--apply", "--apply-as", "schedule"))
    assert proc.returncode == 2, proc.stderr
    assert ("--apply-as schedule: gpu1 runs sglang-0.5.12, whose server takes no budget schedule (the v2 family, "
            "SGLang 0.5.20 - 0.5.23, does); nothing launched") in proc.stderr
    assert proc.stderr.count("error:") == 1 and not pid_file.exists() and not (tmp_path / "out").exists()
    assert inventory.read_text() == before
