"""`ddtree-deploy tune` end to end on the v2 family: a real sshd on loopback, a host Python with
the real SGLang 0.5.23 and the real sglang-0.5.20 series pushed (``tuned_host_0_5_23``), the
release's OWN ``python -m sglang.benchmark.serving`` driving the tune STAND-IN server
(ddtree_testkit/standin_tune_server.py: no GPU here; its synthetic model makes each sweep's
choice known in advance): the operator's prompt file by category, and the budget schedule
``--apply`` writes.

Apart from tests/e2e/test_tune_ssh.py (the 0.5.12.post1 host; the same helpers, tests/tune_host.py)
so that `make test`'s workers take the two hosts' sweeps at once: each file is several
minutes on two shared cores (a benchmark start per category and concurrency, 10-20 s each).
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


# ---------------------------------------------------------------- the operator's prompts on 0.5.23


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
    model's steady state); --itl-margin wide so the trees count everywhere. --requests 32: one
    wave at 32 (all of them decoding together: the steady state throughout), and at one request
    32 in a row, each a wait the stand-in sleeps step by step (~0.7 s without speculation): 64
    waited ~45 s more on two cores for the same ranking (B=16 +13% at 1, none +35% at 32).
    auto writes the schedule, carrying 32 with the fastest tree there and saying what it costs; the
    inventory reads back, the payload's own parser takes the schedule, and the launch sends it."""
    import importlib.util

    from ddtree_deploy.settings.smoke import family_smoke, parse_settings
    from ddtree_deploy.smoke import plan as smoke_plan

    h = tuned_host_0_5_23
    inventory, _ = write_inventory(h, [])
    out = tmp_path / "out"
    proc = run_cli(["tune", "--host", str(inventory), "--baseline", "none", "--budgets", "8,16", "--topk", "2",
                    "--concurrency", "1,32", "--requests", "32", "--input-len", "16", "--output-len", "24",
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
