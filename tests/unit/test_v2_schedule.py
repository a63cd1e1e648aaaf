"""The DDTREE budget schedule grammar (payload/ddtree_schedule.py), the one the v2 plugin and
worker use on a server and the toolkit uses to write schedules (ddtree_deploy/settings/
budget_schedule.py loads that very file). Pure: no SGLang, no torch. The schedule resolved
through SGLang's own arguments: tests/integration/test_v2_server_args.py (schedule-* cases); run by the
worker: tests/integration/test_v2_worker.py (schedule_lossless and its negative control)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
PAYLOAD = REPO / "payload" / "ddtree_schedule.py"


def _payload_module():
    spec = importlib.util.spec_from_file_location("ddtree_schedule_under_test", PAYLOAD)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sched = _payload_module()
E = sched.Entry


def test_the_issue_example_parses_and_resolves():
    entries = sched.parse("1:128/8,8:64/4,32:16/2,64:chain")
    assert entries == (E(1, 128, 8), E(8, 64, 4), E(32, 16, 2), E(64, None, None, chain=True))
    resolved = sched.resolve(entries, draft_block=16)
    assert sched.format_schedule(resolved) == "1:128/8,8:64/4,32:16/2,64:15/1"
    assert [e.width for e in resolved] == [129, 65, 17, 16]
    # Spaces and case are forgiven; a missing top-K is min(budget, 8), a larger one clamped.
    assert sched.format_schedule(sched.resolve(sched.parse(" 1 : 4 , 2:CHAIN, 3:6/9 "), 5)) == \
        "1:4/4,2:4/1,3:6/6"


@pytest.mark.parametrize("batch, index", [(0, 0), (1, 0), (7, 0), (8, 1), (31, 1), (32, 2),
                                          (63, 2), (64, 3), (1000, 3)])
def test_pick_is_the_last_entry_at_or_below_the_batch(batch, index):
    entries = sched.parse("1:128/8,8:64/4,32:16/2,64:chain")
    assert sched.pick(entries, batch) == index


def test_ranges_bound_each_entry_by_the_next_and_the_running_batch():
    entries = sched.parse("1:128/8,8:64/4,32:16/2,64:chain")
    assert sched.ranges(entries, 48) == ((1, 7), (8, 31), (32, 48), (64, 48))
    assert sched.ranges(entries, 100) == ((1, 7), (8, 31), (32, 63), (64, 100))


@pytest.mark.parametrize("text, entry, why, works", [
    ("1:64/8,32:16/2,8:32/4", "8:32/4", "thresholds must rise", "1:64/8,8:32/4,32:16/2"),
    ("1:64,8:32,8:16", "8:16", "repeats the batch threshold 8", "1:64,8:32"),
    ("4:64,16:16", "4:64", "the first entry starts at batch 4", "1:64,16:16"),
    ("1:64,x", "x", "is not THRESHOLD:BUDGET[/TOPK]", "1:64"),
    ("1:64,2:0", "2:0", "a budget is at least 1", "1:64,2:1"),
    ("1:64/0", "1:64/0", "a top-K is at least 1", "1:64/1"),
    ("0:64", "0:64", "a batch threshold is at least 1", "1:64"),
    ("", "", "the schedule is empty", "1:64"),
    (",".join(f"{t}:{20 - t}" for t in range(1, 11)), "9:11", "at most 8 entries",
     ",".join(f"{t}:{20 - t}" for t in range(1, 9))),
])
def test_a_bad_schedule_is_one_line_naming_the_entry_and_a_schedule_that_works(text, entry, why,
                                                                               works):
    with pytest.raises(sched.ScheduleError) as caught:
        sched.parse(text)
    fault = caught.value
    assert fault.entry == entry and why in fault.why, (fault.entry, fault.why)
    line = str(fault)
    assert "\n" not in line and f"entry {entry!r}" in line
    assert line.endswith(f"use --speculative-ddtree-budget-schedule {works}"), line
    # The schedule it names parses.
    assert sched.format_schedule(sched.parse(works)) == works


def test_from_table_merges_runs_and_starts_at_one():
    rows = [(64, "chain"), (2, (128, 8)), (4, (128, 8)), (8, (64, 4)), (16, (64, 4)),
            (32, (16, 2))]
    assert sched.from_table(rows) == "1:128/8,8:64/4,32:16/2,64:chain"
    assert sched.from_table([(1, (32, None))]) == "1:32"
    with pytest.raises(sched.ScheduleError):
        sched.from_table([(1, (0, 8))])


def test_the_toolkit_reads_the_payloads_grammar():
    # tune --apply writes with ddtree_deploy.settings.budget_schedule: the payload's own file,
    # so both parse every schedule the same way (here: the very same functions' source).
    from ddtree_deploy.settings import budget_schedule as tool

    assert Path(tool._grammar().__file__).resolve() == PAYLOAD.resolve()
    for text in ("1:128/8,8:64/4,32:16/2,64:chain", "1:64", "2:64", "1:64,1:32", "1:x"):
        try:
            want = sched.format_schedule(sched.parse(text))
        except sched.ScheduleError as fault:
            want = str(fault)
        try:
            got = tool.format_schedule(tool.parse(text))
        except tool.ScheduleError as fault:
            got = str(fault)
        assert got == want, text
    assert tool.from_table([(1, (64, 8)), (16, "chain")]) == "1:64/8,16:chain"


def test_the_payload_module_is_stdlib_only():
    # It is installed into SGLang and loaded by the toolkit: neither may need the other.
    import ast

    tree = ast.parse(PAYLOAD.read_text())
    names = {alias.name.split(".")[0] for node in ast.walk(tree)
             if isinstance(node, ast.Import) for alias in node.names}
    names |= {node.module.split(".")[0] for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and node.module}
    assert names <= {"__future__", "re", "dataclasses", "typing"}, names
