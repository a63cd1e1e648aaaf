"""`ddtree-deploy tune` end to end, its long sweeps: by prompt category at two concurrencies
on SGLang 0.5.12.post1, and on 0.5.23 (its own benchmark module, the budget schedule --apply
writes). A real sshd on loopback, host Pythons with the real releases and the real DDTree
series pushed, SGLang's OWN benchmark from each release driving the load, the tune STAND-IN
server (ddtree_testkit/standin_tune_server.py: no GPU here; its synthetic model makes each
sweep's choice known in advance).

Apart from tests/test_tune_ssh.py (the same host helpers: tests/tune_host.py) because these
sweeps are the longest of the tune tests (a benchmark start per category and concurrency,
10-20 s each on two shared cores): two files run on two workers at once under `make test`.
"""

from __future__ import annotations

import json
import sys

import pytest

from ddtree_deploy.engine.series import load_family
from ddtree_deploy.settings.inventory import load_host

from envelope_check import check_envelope  # tests/envelope_check.py: the --json contract
from tune_host import REPO, prompt_file, run_cli, write_inventory

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]


# ---------------------------------------------------------------- the operator's prompts, by release


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


def test_0_5_23_runs_sglang_benchmark_serving(tuned_host_0_5_23, tmp_path):
    """0.5.23 ships sglang/benchmark/serving.py (its sglang.bench_serving is a shim that warns it
    will be removed): tune runs the new module, with the same prompt file and categories."""
    h = tuned_host_0_5_23
    inventory, _ = write_inventory(h, ["--accept-bonus", "w299=0.8"])
    proc = run_cli(["tune", "--host", str(inventory), "--prompts", str(prompt_file(tmp_path / "p.jsonl")),
                    "--baseline", "none", "--budgets", "8", "--topk", "2", "--concurrency", "2", "--requests", "4",
                    "--output-len", "16", "--repeats", "0", "--out", str(tmp_path / "out"), "--json"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "benchmark: python -m sglang.benchmark.serving; prompts: " in proc.stderr
    doc = json.loads(proc.stdout)["hosts"][0]
    assert [(r["config"], r["status"]) for r in doc["runs"]] == [("none", "ok"), ("ddtree-b8-k2", "ok")]
    row = next(r for r in doc["ranking"]["2"] if r["config"] == "ddtree-b8-k2")
    assert sorted(row["categories"]) == ["chat", "code"] and row["category_accept"]["code"] > 1.0
    logs = list((h["test_host"].state_dir / "tune").rglob("*.bench.log"))
    assert logs and not any("deprecated" in p.read_text() for p in logs)  # the module itself, not the shim


# ---------------------------------------------------------------- --apply writes the budget schedule


def test_apply_writes_the_schedule_on_the_v2_family_and_says_what_no_speculation_costs(tuned_host_0_5_23, tmp_path):
    """The v2 family (SGLang 0.5.23) takes --speculative-ddtree-budget-schedule. The tune stand-in's
    model (ddtree_testkit/standin_tune_server.py): at one request the deep tree (B=16) wins, at 32
    no speculation does (each verify costs W x C: B=8 serves ~35% fewer tokens/s there in the
    model's steady state); --itl-margin wide so the trees count everywhere.
    auto writes the schedule, carrying 32 with the fastest tree there and saying what it costs; the
    inventory reads back, the payload's own parser takes the schedule, and the launch sends it."""
    import importlib.util

    from ddtree_deploy.settings.smoke_settings import family_smoke, parse_settings
    from ddtree_deploy.smoke import smoke_plan

    h = tuned_host_0_5_23
    inventory, _ = write_inventory(h, [])
    out = tmp_path / "out"
    proc = run_cli(["tune", "--host", str(inventory), "--baseline", "none", "--budgets", "8,16", "--topk", "2",
                    "--concurrency", "1,32", "--requests", "64", "--input-len", "16", "--output-len", "24",
                    "--itl-margin", "400", "--repeats", "0", "--out", str(out), "--apply", "--json"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    doc = check_envelope(proc.stdout, proc.returncode, "tune")["hosts"][0]
    best = {row["concurrency"]: row["config"] for row in doc["best_per_concurrency"]}
    assert best == {1: "ddtree-b16-k2", 32: "none"}, doc["best_per_concurrency"]
    assert doc["schedule"] == "1:16/2,32:8/2"
    [note] = doc["schedule_plan"]["notes"]
    assert note.startswith("concurrency 32: no speculation was fastest (") and \
        "the schedule serves DDTree B=8 K=2 there (" in note and "% against no speculation)" in note, note
    a = doc["apply"]
    assert a["written"] and a["as"] == "schedule" and a["schedule"] == "1:16/2,32:8/2" and a["notes"] == [note]
    assert a["why_as"] == ("auto: the winners differ across concurrencies and the family sglang-0.5.20 takes a "
                           "budget schedule")
    # The results file keeps the per-concurrency table and the plan.
    closing = json.loads((out / "results.jsonl").read_text().splitlines()[-1])
    assert closing["best_per_concurrency"] == doc["best_per_concurrency"]
    assert closing["schedule_plan"]["notes"] == [note]
    # The inventory: budget and topk gone, the schedule in; it loads; the payload parses it.
    text = inventory.read_text()
    assert 'budget_schedule = "1:16/2,32:8/2"' in text and "budget = 64" not in text
    launch = parse_settings(load_host(str(inventory)).smoke, source=str(inventory)).launch
    assert (launch.budget_schedule, launch.budget, launch.topk) == ("1:16/2,32:8/2", None, None)
    spec = importlib.util.spec_from_file_location("payload_schedule_ssh", REPO / "payload" / "ddtree_schedule.py")
    payload = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = payload
    spec.loader.exec_module(payload)
    assert payload.format_schedule(payload.parse(launch.budget_schedule)) == "1:16/2,32:8/2"
    argv = smoke_plan.launch_argv(launch, family=family_smoke(load_family(REPO / "patches" / "sglang-0.5.20")))
    assert argv[-2:] == ["--speculative-ddtree-budget-schedule", "1:16/2,32:8/2"]
    assert "--speculative-ddtree-budget" not in argv and "{budget}" not in " ".join(argv)
    assert f"--apply: {inventory}:" in proc.stderr and '+budget_schedule = "1:16/2,32:8/2"' in proc.stderr  # the diff
