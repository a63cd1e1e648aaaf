"""The judged tree report reads the same wherever a detail line ends with it: the smoke launch,
the serve restart and the container start (one renderer, ``smoke.tree_line``); the container's
line once dropped the budget schedule's widths."""

from __future__ import annotations

from ddtree_deploy.hostprog import container, serve, smoke

TREE = {"verify_width": 9, "budget": 8, "worker_class": "DFlashWorker", "offchain_accepts": 3,
        "schedule": [{"threshold": 1, "verify_width": 9, "steps": 4},
                     {"threshold": 8, "verify_width": 5, "steps": 2}]}
SAID = ("DDTREE verify width 9 = budget 8 + 1, DFlashWorker, 3 off-chain accepts, "
        "schedule widths 9/5 ran 4/2 steps")


def test_tree_line_names_width_budget_worker_accepts_and_schedule() -> None:
    assert smoke.tree_line(TREE) == SAID
    no_schedule = {k: v for k, v in TREE.items() if k != "schedule"}
    assert smoke.tree_line(no_schedule) == SAID.split(", schedule")[0]


def test_every_healthy_line_ends_with_the_same_tree_words() -> None:
    restarted = {"health": {"seconds": 1.25, "processes": [{"pid": 41}]}, "restart": {"seconds": 0.5},
                 "proof": {"tree": TREE}}
    started = {"health": {"seconds": 2.0}, "container": {"id": "0123456789abcdef"}, "proof": {"tree": TREE}}
    launched = {"ready_s": 3.0, "ready_by": "/health", "tree": TREE}
    assert serve._healthy_line(restarted) == "healthy 1.8 s after the restart (pid 41); " + SAID
    assert container._healthy_line(started) == "healthy 2.0 s after the start (container 0123456789ab); " + SAID
    assert smoke._launch_detail(launched) == "ready in 3.0 s (/health), " + SAID


def test_no_tree_report_no_tree_words() -> None:
    assert serve._healthy_line({"health": {"seconds": 1.0, "processes": []}, "restart": {"seconds": 0.0}}) == (
        "healthy 1.0 s after the restart (pid none found)")
    assert container._healthy_line({"health": {"seconds": 1.0}, "container": None}) == (
        "healthy 1.0 s after the start (container ?)")
