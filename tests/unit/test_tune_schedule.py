"""`tune --apply` writing the per-batch-size budget schedule (issue 29 §3, issue 30's flag), the
pure part: the schedule a sweep implies (``tune.plan``), accepted by the PAYLOAD's own parser
(payload/ddtree_schedule.py, loaded here by path, apart from the toolkit's loader); a "no
speculation" winner carried honestly; ``--apply-as`` decided; the inventory written, kept
byte for byte elsewhere, read back by the toolkit's loader both ways (schedule <-> budget);
``[smoke.launch] budget_schedule`` checked with the payload's grammar and sent with the
family's flag instead of the budget flags; bad input in one line, exit 2. Over real sshd:
tests/e2e/test_tune_ssh.py.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli import app
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.settings.inventory import parse_host
from ddtree_deploy.settings.smoke import family_smoke, parse_settings
from ddtree_deploy.smoke import plan as smoke_plan
from ddtree_deploy.tuning import tune, run as tune_run
from ddtree_deploy.tuning.tune import Config, Measure, Record, TuneOptions
from ddtree_deploy.tuning.apply import apply_launch, decide, edit_launch

REPO = Path(__file__).resolve().parent.parent.parent
V2 = family_smoke(load_family(REPO / "patches" / "sglang-0.5.20"))
V1 = family_smoke(load_family(REPO / "patches" / "sglang-0.5.12"))


def payload_parser():
    """The payload's schedule module as the server imports it: the file itself, by path."""
    name = "payload_ddtree_schedule_under_test"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "payload" / "ddtree_schedule.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def rec(key: str, tps_itl: dict) -> Record:
    return Record(config=Config.from_key(key), stage="coarse", status="ok",
                  measures=tuple(Measure(c, tps, 1.0, 10, 20, 5, itl, completed=10) for c, (tps, itl) in tps_itl.items()))


OPTS = TuneOptions(budgets=(4, 16), topk=(2,), concurrency=(1, 8, 32), baselines=("none",), itl_margin_pct=400)
# The tune stand-in's shape (ddtree_testkit/standin_tune_server.py): the deep tree wins alone,
# the shallow one at 8, no speculation at 32.
RECORDS = [rec("none", {1: (33, 31), 8: (230, 35), 32: (650, 49)}),
           rec("ddtree-b16-k2", {1: (75, 46), 8: (300, 80), 32: (310, 362)}),
           rec("ddtree-b4-k2", {1: (53, 39), 8: (340, 60), 32: (505, 132)})]


def test_the_plan_is_the_payloads_schedule_and_says_what_no_speculation_costs():
    plan = tune.plan(OPTS, RECORDS)
    assert plan.text == "1:16/2,8:4/2" and plan.differ
    assert [(r["concurrency"], r["best"], r["served"]) for r in plan.rows] == [
        (1, "ddtree-b16-k2", "ddtree-b16-k2"), (8, "ddtree-b4-k2", "ddtree-b4-k2"), (32, "none", "ddtree-b4-k2")]
    assert plan.notes == ("concurrency 32: no speculation was fastest (650.0 tok/s), which the payload's schedule "
                          "cannot express (it has no entry without speculation): the schedule serves DDTree B=4 K=2 "
                          "there (505.0 tok/s, -22.3% against no speculation)",)
    # The payload's own parser takes it, and resolves it against a draft block.
    sched = payload_parser()
    entries = sched.parse(plan.text)
    assert sched.format_schedule(entries) == plan.text
    assert [(e.threshold, e.budget, e.topk) for e in sched.resolve(entries, 16)] == [(1, 16, 2), (8, 4, 2)]
    assert sched.pick(entries, 32) == 1  # batch 32 runs the B=4 entry, as the note says


def test_a_chain_winner_and_one_winner_everywhere():
    records = [rec("dflash", {1: (50, 30), 8: (300, 40)}), rec("ddtree-b16-k2", {1: (80, 35), 8: (200, 45)})]
    opts = TuneOptions(budgets=(16,), topk=(2,), concurrency=(1, 8), baselines=("dflash",), itl_margin_pct=400)
    plan = tune.plan(opts, records)
    assert plan.text == "1:16/2,8:chain" and payload_parser().parse(plan.text)[1].chain
    same = tune.plan(opts, [rec("dflash", {1: (50, 30), 8: (100, 40)}),
                            rec("ddtree-b16-k2", {1: (80, 35), 8: (200, 45)})])
    assert same.text == "1:16/2" and not same.differ and same.notes == ()


def test_no_speculation_everywhere_with_nothing_that_qualifies_gives_no_schedule():
    opts = TuneOptions(budgets=(16,), topk=(2,), concurrency=(1, 8), baselines=("none",), itl_margin_pct=10)
    plan = tune.plan(opts, [rec("none", {1: (50, 30), 8: (300, 40)}), rec("ddtree-b16-k2", {1: (40, 80), 8: (20, 90)})])
    assert plan.text is None and plan.why_none.startswith("no configuration the schedule can serve")
    assert len(plan.notes) == 2 and all("no speculative configuration qualified there" in n for n in plan.notes)


def test_apply_as_decides_schedule_budget_or_nothing():
    plan, choice = tune.plan(OPTS, RECORDS), tune.choose(OPTS, RECORDS)
    flag = V2.schedule_flag
    assert flag == "--speculative-ddtree-budget-schedule" and V1.schedule_flag is None
    assert decide("auto", plan, choice, schedule_flag=flag, family="sglang-0.5.20").write == "schedule"
    d = decide("auto", plan, choice, schedule_flag=None, family="sglang-0.5.12")
    assert d.write == "budget" and d.why.startswith("auto: the winners differ across concurrencies, but the family "
                                                    "sglang-0.5.12 takes no budget schedule")
    assert decide("budget", plan, choice, schedule_flag=flag, family="f").write == "budget"
    assert decide("schedule", plan, choice, schedule_flag=None, family="f").write == "nothing"
    same = tune.plan(OPTS, RECORDS[:2])
    assert decide("auto", replace(same, differ=False), choice, schedule_flag=flag, family="f").why.startswith(
        "auto: the same configuration is fastest at every concurrency swept")


INVENTORY = """\
[ssh]
host = "ct200"   # the alias

[host]
python = "/opt/sglang/.venv/bin/python"

[smoke.launch]
model = "/models/Qwen3-8B"
budget = 64        # set by hand in March
topk = 8
port = 30188
# DDTREE needs flashinfer or triton
extra_args = ["--attention-backend", "flashinfer"]
"""


def launch_of(text: str, path: str = "ct200.toml"):
    return parse_settings(parse_host(text, name="ct200", source=path).smoke, source=path).launch


def test_the_schedule_is_written_read_back_and_turned_back_into_a_budget(tmp_path):
    path = tmp_path / "ct200.toml"
    path.write_text(INVENTORY)
    done = apply_launch(path, schedule="1:16/2,8:4/2")
    after = path.read_text()
    assert done["written"] and done["as"] == "schedule" and done["schedule"] == "1:16/2,8:4/2"
    # Only the keys change: budget and topk go (the server refuses them beside a schedule).
    assert after == INVENTORY.replace("budget = 64        # set by hand in March\ntopk = 8\n", "") \
        + 'budget_schedule = "1:16/2,8:4/2"\n'
    assert "-budget = 64        # set by hand in March" in done["diff"] and '+budget_schedule = "1:16/2,8:4/2"' \
        in done["diff"]
    launch = launch_of(after, str(path))
    assert (launch.budget_schedule, launch.budget, launch.topk) == ("1:16/2,8:4/2", None, None)
    payload_parser().parse(launch.budget_schedule)
    assert not apply_launch(path, schedule="1:16/2,8:4/2")["written"]
    # And back: --apply-as budget removes the schedule.
    apply_launch(path, budget=32, topk=4)
    launch = launch_of(path.read_text(), str(path))
    assert (launch.budget_schedule, launch.budget, launch.topk) == (None, 32, 4)
    assert "# DDTREE needs flashinfer or triton" in path.read_text()


def test_a_write_the_loader_would_refuse_is_never_made(tmp_path):
    with pytest.raises(BadInput) as exc:
        edit_launch(INVENTORY, schedule="1:16/2,1:4/2", source="ct200.toml")
    assert exc.value.message.startswith("ct200.toml: --apply would leave [smoke.launch] unreadable (")


@pytest.mark.parametrize("value, message", [
    ('"8:16/2,1:4/2"', "ct200.toml: line 10: smoke.launch.budget_schedule: entry '1:4/2': its batch threshold 1 "
                       "comes after 8: thresholds must rise; write e.g. budget_schedule = \"1:4/2,8:16/2\" "
                       "(docs/patches-v2.md: The budget schedule)"),
    ('"1:16/x"', "ct200.toml: line 10: smoke.launch.budget_schedule: entry '1:16/x': is not THRESHOLD:BUDGET[/TOPK] "
                 "or THRESHOLD:chain; write e.g. budget_schedule = \"1:64\" (docs/patches-v2.md: The budget "
                 "schedule)"),
])
def test_a_bad_schedule_in_the_inventory_is_one_line(value, message):
    text = INVENTORY.replace("budget = 64        # set by hand in March\ntopk = 8\n", "") \
        .replace("port = 30188\n", f"port = 30188\nbudget_schedule = {value}\n")
    with pytest.raises(BadInput) as exc:
        launch_of(text)
    assert exc.value.message == message


def test_a_schedule_beside_a_budget_is_refused():
    with pytest.raises(BadInput) as exc:
        launch_of(INVENTORY + 'budget_schedule = "1:16/2"\n')
    assert exc.value.message == ("ct200.toml: line 14: smoke.launch.budget_schedule: set beside budget: the server "
                                 "refuses a schedule beside --speculative-ddtree-budget / -topk (each entry carries its "
                                 "own); remove budget from [smoke.launch], or remove budget_schedule")


def test_the_launch_sends_the_familys_schedule_flag_instead_of_the_budget():
    launch = launch_of(INVENTORY.replace("budget = 64        # set by hand in March\ntopk = 8\n", "")
                       + 'budget_schedule = "1:16/2,8:chain"\n')
    argv = smoke_plan.launch_argv(launch, family=V2)
    assert argv[-2:] == ["--speculative-ddtree-budget-schedule", "1:16/2,8:chain"]
    assert "--speculative-ddtree-budget" not in argv and "--speculative-ddtree-topk" not in argv
    # A command template: its budget/top-K options go, with their values.
    template = replace(launch, command=("{python}", "srv", "--speculative-ddtree-budget", "{budget}",
                                        "--speculative-ddtree-topk={topk}", "--port", "{port}"))
    assert smoke_plan.launch_argv(template, family=V2) == [
        "{python}", "srv", "--port", "30188", "--speculative-ddtree-budget-schedule", "1:16/2,8:chain"]
    with pytest.raises(BadInput) as exc:
        smoke_plan.launch_argv(launch, family=V1, source="ct200.toml")
    assert "smoke.launch.budget_schedule: this host's DDTree family takes no budget schedule" in exc.value.message
    # tune's own launches measure one tree each: the inventory's schedule never reaches them.
    target = tune_run.Target(launch=launch, family=V2, series={"name": "sglang-0.5.20"}, sglang_version="0.5.23")
    one = tune_run.launch_argv(target, Config("ddtree", 16, 2))
    assert "--speculative-ddtree-budget-schedule" not in one and one[one.index("--speculative-ddtree-budget") + 1] \
        == "16"
    assert "--speculative-ddtree-budget-schedule" not in tune_run.launch_argv(target, Config("dflash"))


@pytest.mark.parametrize("args, message", [
    (["--apply-as", "schedule"], "--apply-as schedule: only with --apply"),
    (["--apply", "--apply-as", "both"], "--apply-as 'both': not one of auto, schedule, budget"),
])
def test_bad_apply_as_is_one_line_before_any_host(args, message, tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))
    r = CliRunner().invoke(app, ["tune", "--host", "nosuch", *args])
    assert r.exit_code == 2 and message in r.output and "nosuch" not in r.output, r.output


def test_the_grammar_is_read_on_first_use_and_a_payload_without_it_is_one_line(tmp_path, monkeypatch):
    """Every push imports budget_schedule (through tune's code); a payload folder of the
    operator's own without the grammar must not break a push that sets no schedule, and a
    schedule asked of it says which folder lacks which file."""
    from ddtree_deploy.base.errors import DeployError
    from ddtree_deploy.settings import budget_schedule

    monkeypatch.setenv("DDTREE_DEPLOY_PAYLOAD", str(tmp_path))
    monkeypatch.delitem(sys.modules, budget_schedule._NAME, raising=False)
    with pytest.raises(DeployError, match=rf"^{tmp_path}/ddtree_schedule.py: the payload folder has no budget "
                       "schedule grammar$") as exc:
        budget_schedule.parse("1:8/2")
    assert "DDTREE_DEPLOY_PAYLOAD" in (exc.value.hint or "")
    monkeypatch.delenv("DDTREE_DEPLOY_PAYLOAD")
    assert budget_schedule.format_schedule(budget_schedule.parse("1:8/2,4:chain")) == "1:8/2,4:chain"
