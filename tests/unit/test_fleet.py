"""The fleet policy and its runner, without hosts: selection, groups, canary, waves,
max-failures, outcome kinds, and the thread loop (its work is plain Python here; the
end-to-end runs over real sshd hosts are in test_fleet_ssh.py)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput, Changed, DeployError
from ddtree_deploy.fleets.fleet import (
    FleetReport,
    HostResult,
    Kind,
    Schedule,
    outcome_of_error,
    push_policy,
    select,
    spread_policy,
)
from ddtree_deploy.fleets.run import run_fleet
from ddtree_deploy.fleets.rollout import AfterPush, push_detail, push_kind, rollback_kind
from ddtree_deploy.session.push import Outcome
from ddtree_deploy.session.plan import FileState, FileStep, Plan
from ddtree_deploy.settings.inventory import load_groups, load_host, parse_groups
from ddtree_deploy.smoke.report import LevelResult, SmokeReport

HOSTS = ["a", "b", "c", "d", "e"]


# ---------------------------------------------------------------- selection and groups


def test_select_keeps_order_drops_repeats_and_expands_groups_after_hosts():
    groups = {"gpu": ("c", "a", "d"), "edge": ("e",)}
    assert select(["b"], ["gpu", "edge"], groups) == ["b", "c", "a", "d", "e"]
    assert select(["a", "a"], ["gpu"], groups) == ["a", "c", "d"]
    with pytest.raises(BadInput, match=r"--group cpu: no such group \(groups: edge, gpu\)"):
        select([], ["cpu"], groups)
    with pytest.raises(BadInput, match="no host selected"):
        select([], [], groups)


def test_groups_file(tmp_path):
    assert load_groups(tmp_path) == {}  # no file, no groups
    (tmp_path / "groups.toml").write_text('[groups]\ngpu = ["ct200", "ct201"]\nsolo = ["ct300"]\n')
    assert load_groups(tmp_path) == {"gpu": ("ct200", "ct201"), "solo": ("ct300",)}


@pytest.mark.parametrize("text, problem", [
    ('gpu = ["a"]\n', "line 1: gpu: unknown key; put groups in a [groups] table"),
    ('groups = 3\n', "line 1: groups: must be a table, not 3; write it as a [groups] table"),
    ('[groups]\ngpu = []\n', "line 2: groups.gpu: must be a non-empty list of host names; "),
    ('[groups]\ngpu = "a"\n', "line 2: groups.gpu: must be a non-empty list of host names; "),
    ('[groups]\ngpu = ["a", "a;rm"]\n', "line 2: groups.gpu: 'a;rm' is not a host name; "),
    ('[groups]\ngpu = ["a", 1]\n', "line 2: groups.gpu: 1 is not a host name; "),
    ('[groups]\ngpu = ["a", "b", "a"]\n', "line 2: groups.gpu: 'a' is listed twice; "),
    ('[groups]\n"g p u" = ["a"]\n', "line 2: groups.g p u: a group name uses letters"),
])
def test_bad_groups_are_one_line_naming_the_key(tmp_path, text, problem):
    path = tmp_path / "groups.toml"
    path.write_text(text)
    with pytest.raises(BadInput) as exc:
        load_groups(tmp_path)
    assert exc.value.message.startswith(f"{path}: {problem}")


def test_bad_toml_and_reserved_host_name(tmp_path):
    (tmp_path / "groups.toml").write_text("[groups\n")
    with pytest.raises(BadInput, match="groups.toml: line 1: not valid TOML"):
        load_groups(tmp_path)
    with pytest.raises(BadInput, match="reserved"):
        load_host("groups", directory=tmp_path)
    assert parse_groups({}, source="x") == {}


# ---------------------------------------------------------------- policies


def test_push_policy_validation():
    p = push_policy(HOSTS, canary=None, parallel=None, max_failures=0)
    assert (p.canary, p.parallel, p.max_failures) == ("a", 5, 0)
    assert push_policy(HOSTS, canary="c", parallel=9, max_failures=2).to_json() == \
        {"canary": "c", "parallel": 5, "max_failures": 2, "waves": False}
    with pytest.raises(BadInput, match=r"--canary z: not one of the selected hosts \(a, b, c, d, e\)"):
        push_policy(HOSTS, canary="z", parallel=None, max_failures=0)
    with pytest.raises(BadInput, match="--parallel 0: must be 1 or more"):
        push_policy(HOSTS, canary=None, parallel=0, max_failures=0)
    with pytest.raises(BadInput, match="--max-failures -1"):
        push_policy(HOSTS, canary=None, parallel=None, max_failures=-1)
    s = spread_policy(HOSTS, parallel=2)
    assert (s.canary, s.parallel, s.max_failures) == (None, 2, None)


def _drain(schedule: Schedule, kinds: dict[str, Kind]) -> list[list[str]]:
    """Finish hosts in start order; returns the batches ``ready`` gave."""
    batches, running = [], []
    while not schedule.done:
        batch = schedule.ready()
        if batch:
            batches.append(batch)
            running += batch
        host = running.pop(0)
        schedule.record(host, kinds.get(host, Kind.PUSHED))
    return batches


def test_canary_alone_first_then_the_others_in_waves():
    s = Schedule(HOSTS, push_policy(HOSTS, canary="c", parallel=2, max_failures=0))
    assert s.ready() == ["c"] and s.ready() == []  # nobody else while the canary runs
    s.record("c", Kind.PUSHED)
    assert s.ready() == ["a", "b"] and s.ready() == []  # --parallel 2
    s.record("b", Kind.ALREADY)
    assert s.ready() == ["d"]
    s.record("a", Kind.PUSHED)
    s.record("d", Kind.PUSHED)
    assert s.ready() == ["e"] and not s.done
    s.record("e", Kind.PUSHED)
    assert s.done and s.skipped() == [] and s.stop_reason is None


def test_restart_waves_start_only_when_the_previous_wave_ended():
    """[serve] hosts: the canary, then `parallel` together; the next wave waits for the whole one."""
    s = Schedule(HOSTS, push_policy(HOSTS, canary="c", parallel=2, max_failures=0, waves=True))
    assert s.ready() == ["c"]
    s.record("c", Kind.PUSHED)
    assert s.ready() == ["a", "b"]
    s.record("b", Kind.RESTARTED)
    assert s.ready() == []  # a sliding window would start d here; a wave waits for a too
    s.record("a", Kind.PUSHED)
    assert s.ready() == ["d", "e"]
    s.record("d", Kind.PUSHED), s.record("e", Kind.PUSHED)
    assert s.done and s.wave_of == {"c": 1, "a": 2, "b": 2, "d": 3, "e": 3}


def test_a_host_left_down_keeps_its_place_so_never_more_than_parallel_are_down():
    s = Schedule(HOSTS, push_policy(HOSTS, canary=None, parallel=2, max_failures=3, waves=True))
    assert s.ready() == ["a"]
    s.record("a", Kind.PUSHED)
    assert s.ready() == ["b", "c"]
    s.record("b", Kind.UNHEALTHY, down=True)  # its server stayed down: one place left
    s.record("c", Kind.PUSHED)
    assert s.ready() == ["d"]
    s.record("d", Kind.FAILED_NOT_ROLLED_BACK, down=True)
    assert s.ready() == [] and s.done and s.skipped() == ["e"]
    assert s.stop_reason == "2 host(s) left with their server down: starting another would take more than " \
        "--parallel 2 down"


@pytest.mark.parametrize("kind", [Kind.FAILED_ROLLED_BACK, Kind.UNREACHABLE, Kind.FAILED_UNCHANGED])
def test_a_failed_canary_starts_nobody_else(kind):
    s = Schedule(HOSTS, push_policy(HOSTS, canary=None, parallel=None, max_failures=3))
    assert s.ready() == ["a"]
    s.record("a", kind)
    assert s.ready() == [] and s.done and s.skipped() == ["b", "c", "d", "e"]
    assert s.stop_reason == f"the canary a ended {kind.value}"


def test_max_failures_stops_new_starts_but_running_hosts_finish():
    s = Schedule(HOSTS, push_policy(HOSTS, canary=None, parallel=2, max_failures=0))
    s.ready(), s.record("a", Kind.PUSHED)
    assert s.ready() == ["b", "c"]
    s.record("b", Kind.FAILED_ROLLED_BACK)
    assert s.ready() == [] and not s.done  # c is still running: it finishes
    s.record("c", Kind.PUSHED)
    assert s.done and s.skipped() == ["d", "e"] and "1 host(s) failed (--max-failures 0)" == s.stop_reason


def test_a_failure_once_every_host_has_started_stops_nothing():
    """Issue 24 (3): the canary pushed, then b and c together; b fails while c goes on and is
    pushed. No host was left unstarted: nothing was stopped, and the footer says nothing so."""
    hosts = ["a", "b", "c"]
    s = Schedule(hosts, push_policy(hosts, canary=None, parallel=None, max_failures=0))
    assert s.ready() == ["a"]
    s.record("a", Kind.PUSHED)
    assert s.ready() == ["b", "c"]
    s.record("b", Kind.FAILED_ROLLED_BACK)
    s.record("c", Kind.PUSHED)
    assert s.done and s.skipped() == [] and s.stop_reason is None
    # A canary failing alone (no other host selected) stops nothing either.
    s = Schedule(["a"], push_policy(["a"], canary=None, parallel=None, max_failures=0))
    s.ready(), s.record("a", Kind.FAILED_ROLLED_BACK)
    assert s.done and s.stop_reason is None


def test_the_fleet_footer_at_80_columns_says_what_happened():
    """The outcome table's footer, as an 80-column terminal shows it: a stop names the hosts it
    left unstarted; a failure once all had started prints no stop line."""
    from rich.console import Console

    from ddtree_deploy.cli import fleet_view
    from ddtree_deploy.fleets.fleet import FleetReport, HostResult

    def shown(results, stop):
        console = Console(width=80, record=True, file=open(os.devnull, "w"))
        report = FleetReport("push", push_policy(["a", "b", "c"], canary=None, parallel=None, max_failures=0),
                             tuple(results), stop, 1.0)
        old = fleet_view.err
        fleet_view.err = console
        try:
            fleet_view.print_outcomes(report)
        finally:
            fleet_view.err = old
        text = console.export_text()
        assert all(len(line) <= 80 for line in text.splitlines()), text
        return text

    every = shown([HostResult("a", Kind.PUSHED, {}), HostResult("b", Kind.FAILED_ROLLED_BACK, {}, "smoke failed"),
                   HostResult("c", Kind.PUSHED, {})], None)
    assert "stopped" not in every and "not all ok: 2 pushed, 1 failed, rolled back" in every, every
    stopped = shown([HostResult("a", Kind.FAILED_ROLLED_BACK, {}, "smoke failed"),
                     HostResult("b", Kind.SKIPPED, {}, "not started"), HostResult("c", Kind.SKIPPED, {}, "x")],
                    "the canary a ended failed, rolled back")
    assert "stopped starting hosts: the canary a ended failed, rolled back; not started: b, c" in \
        " ".join(stopped.split()), stopped


def test_max_failures_tolerates_k():
    kinds = {"b": Kind.UNREACHABLE, "c": Kind.FAILED_UNCHANGED, "d": Kind.FAILED_ROLLED_BACK}
    s = Schedule(HOSTS, push_policy(HOSTS, canary=None, parallel=1, max_failures=2))
    assert _drain(s, kinds) == [["a"], ["b"], ["c"], ["d"]]  # the third failure stops it
    assert s.skipped() == ["e"]
    s = Schedule(HOSTS, push_policy(HOSTS, canary=None, parallel=1, max_failures=3))
    assert _drain(s, kinds) == [["a"], ["b"], ["c"], ["d"], ["e"]] and s.skipped() == []


def test_rollback_and_status_never_stop():
    s = Schedule(HOSTS, spread_policy(HOSTS, parallel=2))
    kinds = {h: Kind.UNREACHABLE for h in HOSTS}
    assert _drain(s, kinds) == [["a", "b"], ["c"], ["d"], ["e"]]
    assert s.skipped() == [] and s.stop_reason is None


# ---------------------------------------------------------------- outcomes


def test_outcome_kinds():
    assert outcome_of_error(DeployError("x", code="connect")) is Kind.UNREACHABLE
    for code in ("locked", "drift", "host-key", "check-failed", "other-series"):
        assert outcome_of_error(DeployError("x", code=code)) is Kind.FAILED_UNCHANGED
    assert outcome_of_error(BadInput("x")) is Kind.FAILED_UNCHANGED
    # An error this module cannot place before the switch is never called "no change".
    assert outcome_of_error(DeployError("x", code="connection-lost")) is Kind.FAILED_UNKNOWN
    # The agent's preflight refuses before any write; a failed switch it undid leaves the host unchanged.
    for code in ("preflight", "permission", "no-space", "unsafe-file", "bad-state-dir"):
        assert outcome_of_error(DeployError("x", code=code)) is Kind.FAILED_UNCHANGED
    assert outcome_of_error(DeployError("x", code="failed-unchanged")) is Kind.FAILED_UNCHANGED
    assert not Kind.FAILED_UNCHANGED.ok
    assert outcome_of_error(DeployError("x", code="agent")) is Kind.FAILED_UNKNOWN
    # The stages before a push's apply request say so when they raise, whatever the code:
    # a new error, the same sentence, ``changed`` given; the one caught is never edited.
    early = DeployError("h: discover: no sglang", code="no-sglang", host="h", step="discover")
    assert outcome_of_error(early) is Kind.FAILED_UNKNOWN and early.changed is Changed.MAYBE
    told = early.known(changed=Changed.NO)
    assert outcome_of_error(told) is Kind.FAILED_UNCHANGED
    assert (told.message, told.code, told.host, told.step, type(told)) == \
        ("h: discover: no sglang", "no-sglang", "h", "discover", DeployError)
    assert early.changed is Changed.MAYBE
    with pytest.raises(AttributeError, match="set when it is made"):
        early.host_unchanged = True


# How a push or rollback that returned ended: decided from the typed values the steps
# return (rollout.push_kind), not from their JSON documents.

def _outcome(*, changed=False, phase=None, plan_changes=None, pending=None, summary="pushed s") -> Outcome:
    out = Outcome("a", "push", "r1", changed=changed, phase=phase, smoke_pending=pending, summary=summary)
    if plan_changes is not None:
        steps = [FileStep(f"f{i}.py", FileState.PRISTINE, "0" * 64, "1" * 64) for i in range(plan_changes)]
        out.plan = Plan("push", "a", tuple(steps) or (FileStep("k.py", FileState.PRISTINE, "0" * 64, "0" * 64),))
    return out


def _report(*statuses: str) -> SmokeReport:
    names = ("compile", "import", "cli")
    return SmokeReport("a", tuple(LevelResult(n, st, 0.1, "import x failed" if st == "failed" else "")
                                  for n, st in zip(names, statuses)))


def test_push_kinds_from_typed_outcomes():
    assert push_kind(_outcome(changed=True), None) is Kind.PUSHED
    assert push_kind(_outcome(), None) is Kind.ALREADY
    failed = _report("passed", "failed")
    undone = _outcome(summary="rolled back 3 file(s) to backup B")
    rolled = AfterPush(failed, rollback=undone, host="a", phase="rolled-back")
    assert push_kind(_outcome(changed=True), rolled) is Kind.FAILED_ROLLED_BACK
    kept = AfterPush(failed, kept=True, host="a")
    assert push_kind(_outcome(changed=True), kept) is Kind.FAILED_NOT_ROLLED_BACK
    assert push_kind(_outcome(plan_changes=3), None, dry_run=True) is Kind.PLANNED
    assert push_kind(_outcome(plan_changes=0), None, dry_run=True) is Kind.ALREADY
    assert rollback_kind(_outcome(plan_changes=3), dry_run=True) is Kind.PLANNED
    assert Kind.PLANNED.ok
    assert rollback_kind(_outcome(changed=True)) is Kind.ROLLED_BACK
    assert rollback_kind(_outcome()) is Kind.ALREADY_ROLLED_BACK
    assert push_detail(_outcome(changed=True), rolled, Kind.FAILED_ROLLED_BACK) == \
        "smoke failed at import: import x failed; rolled back: rolled back 3 file(s) to backup B"
    assert push_detail(_outcome(changed=True), None, Kind.PUSHED) == "pushed s"
    failed_undo = AfterPush(failed, rollback_error="lock held", host="a")
    assert push_kind(_outcome(changed=True), failed_undo) is Kind.FAILED_NOT_ROLLED_BACK
    assert push_detail(_outcome(changed=True), failed_undo, Kind.FAILED_NOT_ROLLED_BACK).endswith(
        "; the automatic rollback FAILED: lock held")


def test_a_host_left_switched_is_not_ok_and_says_why():
    """Files patched, the smoke never passed (it could not run, or the mark failed): exit 1."""
    lost = AfterPush(None, host="a", error="a: connection lost", phase="switched")
    switched = _outcome(changed=True, phase="switched", pending="r1")
    assert push_kind(switched, lost) is Kind.SWITCHED and not Kind.SWITCHED.ok
    assert push_detail(switched, lost, Kind.SWITCHED) == (
        "files switched by run r1, not deployed: the smoke could not run: a: connection lost; "
        "run `ddtree-deploy smoke --host a` or `ddtree-deploy rollback --host a`")
    unmarked = AfterPush(_report("passed"), host="a", mark_error="lock held")
    earlier = _outcome(phase="switched", pending="r0")
    assert push_kind(earlier, unmarked) is Kind.SWITCHED
    assert "run r0, not deployed: the smoke passed but marking it deployed failed: lock held" in \
        push_detail(earlier, unmarked, Kind.SWITCHED)
    # A rerun whose smoke passed and marked the host deployed is ok; one kept by --no-rollback is not.
    rerun = AfterPush(_report("passed"), host="a", marked=True, phase="deployed")
    assert push_kind(_outcome(phase="switched", pending="r0"), rerun) is Kind.PUSHED
    kept = AfterPush(_report("failed"), kept=True, host="a", phase="switched")
    assert push_kind(_outcome(phase="switched", pending="r0"), kept) is Kind.FAILED_NOT_ROLLED_BACK
    assert push_kind(_outcome(phase="switched"), None, dry_run=True) is Kind.ALREADY
    # Switched by an earlier run, and this push ran no smoke (it could not be asked to): not ok.
    assert push_kind(_outcome(phase="switched"), None) is Kind.SWITCHED


def test_report_exit_code_and_json():
    pushed = HostResult("a", Kind.PUSHED, {"host": "a", "summary": "pushed"})
    bad = HostResult("b", Kind.FAILED_UNCHANGED, {"host": "b"}, "bad", 2)
    skip = HostResult("c", Kind.SKIPPED, {"host": "c"}, "not started", 1)
    policy = spread_policy("abc", parallel=None)
    assert FleetReport("push", policy, (pushed,)).exit_code == 0
    report = FleetReport("push", policy, (pushed, bad, skip))
    assert report.exit_code == 2 and not report.ok
    doc = report.to_json()
    assert doc["counts"] == {"pushed": 1, "failed, host unchanged": 1, "skipped": 1}
    assert [(h["host"], h["ok"], h["outcome"]) for h in doc["hosts"]] == \
        [("a", True, "pushed"), ("b", False, "failed, host unchanged"), ("c", False, "skipped")]


# ---------------------------------------------------------------- the runner's thread loop


def test_runner_parallel_limit_isolation_and_skips():
    """Three hosts must be inside ``work`` at once (a barrier that times out otherwise), never
    more than --parallel; one host raising a plain bug is that host's failure only."""
    hosts = ["canary", "w1", "w2", "w3", "boom", "late"]
    barrier = threading.Barrier(3, timeout=20)
    lock, inside, most = threading.Lock(), [0], [0]
    order: list[str] = []

    def work(host, progress):
        progress("working")
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
            order.append(host)
        try:
            if host in ("w1", "w2", "w3"):
                barrier.wait()
            if host == "boom":
                raise ValueError("a bug on one host")
            if host == "late":
                raise DeployError("late: deploy lock held by x", code="locked")
            return HostResult(host, Kind.PUSHED, {"host": host})
        finally:
            with lock:
                inside[0] -= 1

    class Events:
        def __init__(self):
            self.seen = []

        def started(self, host):
            self.seen.append(("started", host))

        def step(self, host, text):
            self.seen.append(("step", host, text))

        def finished(self, result):
            self.seen.append(("finished", result.host, result.kind))

    events = Events()
    report = run_fleet("push", hosts, push_policy(hosts, canary=None, parallel=3, max_failures=5), work, events)
    assert order[0] == "canary" and most[0] == 3
    kinds = {r.host: r.kind for r in report.results}
    assert kinds == {"canary": Kind.PUSHED, "w1": Kind.PUSHED, "w2": Kind.PUSHED, "w3": Kind.PUSHED,
                     "boom": Kind.FAILED_UNKNOWN, "late": Kind.FAILED_UNCHANGED}
    boom = next(r for r in report.results if r.host == "boom")
    assert boom.doc["error"]["code"] == "internal" and "ValueError: a bug on one host" in boom.message
    assert [r.host for r in report.results] == hosts  # selection order, whatever the finishing order
    assert ("step", "w2", "working") in events.seen and events.seen[0] == ("started", "canary")

    stopped = run_fleet("push", hosts, push_policy(hosts, canary="boom", parallel=3, max_failures=5), work)
    assert [r.kind for r in stopped.results] == [Kind.SKIPPED] * 4 + [Kind.FAILED_UNKNOWN, Kind.SKIPPED]
    assert stopped.stop_reason == "the canary boom ended failed, state unknown"
    assert stopped.results[0].message == "not started: the canary boom ended failed, state unknown"


def test_check_once_shares_the_check_between_hosts_of_one_version(tmp_path, monkeypatch):
    from ddtree_deploy.engine.series import load_family
    from ddtree_deploy.session.desired import CheckOnce

    monkeypatch.setenv("DDTREE_DEPLOY_SNAPSHOT", str(tmp_path))
    family = Path(__file__).parent.parent / "data" / "deploy_series" / "patches" / "sglang-0.5.12"
    series = load_family(family)
    again = load_family(family)  # another load of the same content: the same check
    calls = []

    def compute(tag):
        def run():
            calls.append(tag)
            if tag == "boom":
                raise DeployError(f"{tag}: check failed")
            return object()
        return run

    v1 = {"sglang_version": "0.5.12.post1"}
    check = CheckOnce()
    with pytest.raises(DeployError):  # an error is that host's own, never cached
        check("h0", series, v1, False, compute("boom"))
    first = check("h1", series, v1, False, compute("h1"))
    assert check("h2", again, v1, False, compute("h2")) is first
    assert check("h3", series, {"sglang_version": "0.5.13"}, False, compute("h3")) is not first
    assert check("h4", series, v1, True, compute("h4")) is not first  # --family forced: another key
    (tmp_path / "h5").mkdir()  # a snapshot of its own (snapshot pull): checked on its own
    assert check("h5", series, v1, False, compute("h5")) is not first
    assert calls == ["boom", "h1", "h3", "h4", "h5"]


# ---------------------------------------------------------------- status: fine or needs attention (pure)


def _status_doc(**over) -> dict:
    doc = {"phase": "deployed", "mixed": False, "lock": None,
           "files": [{"path": "a.py", "state": "patched"}, {"path": "b.py", "state": "patched"}],
           "serving": {"state": "current", "processes": [], "health": {"url": "http://h:1/health_generate",
                                                                       "status": 200}}}
    doc.update(over)
    return doc


@pytest.mark.parametrize("over, serve, restart, kinds", [
    ({}, True, None, []),
    ({"mixed": True, "files": [{"path": "a.py", "state": "pristine"}]}, False, None, ["mixed"]),
    ({"files": [{"path": "a.py", "state": "drifted"}]}, False, None, ["drifted"]),
    ({"phase": "switched"}, False, None, ["interrupted"]),
    ({"phase": "switching"}, False, None, ["interrupted"]),
    ({"phase": "switched", "lock": {"run_id": "r", "stale": False}}, False, None, []),  # a live run completes it
    ({"phase": "switched", "lock": {"run_id": "r", "stale": True}}, False, None, ["interrupted"]),
    ({"serving": {"state": "stale", "processes": [{"pid": 7, "stale": True}], "health": None}}, False, None,
     ["stale"]),
    ({"serving": {"state": "none", "processes": [], "health": {"url": "u", "status": None}}}, True, None,
     ["unhealthy"]),
    ({"serving": {"state": "none", "processes": [], "health": {"url": "u", "status": None}}}, False, None, []),
    ({"serving": {"state": "unknown", "processes": [], "health": None}}, True, None, ["unhealthy"]),
    ({}, True, {"state": "restarting", "time": "T"}, ["restart-unrecorded"]),
    ({}, True, {"state": "healthy", "time": "T"}, []),
    ({"phase": "rolled-back"}, False, None, []),
    ({"phase": "never-deployed", "files": []}, False, None, []),
])
def test_what_in_a_status_needs_attention(over, serve, restart, kinds):
    from ddtree_deploy.fleets.fleet import attention

    found = attention(_status_doc(**over), serve=serve, restart=restart)
    assert [a["kind"] for a in found] == kinds, found


def test_the_status_footer_counts_each_kind_with_its_hosts():
    from ddtree_deploy.fleets.fleet import FleetReport, HostResult, spread_policy, status_footer

    def read(host, *kinds):
        doc = {"attention": [{"kind": k, "detail": k} for k in kinds]}
        return HostResult(host, Kind.ATTENTION if kinds else Kind.READ, doc)

    results = (read("a"), read("b", "mixed"), read("c", "drifted", "stale"), read("d", "drifted"),
               HostResult("e", Kind.UNREACHABLE, {}, exit_code=1))
    report = FleetReport("status", spread_policy([r.host for r in results], parallel=None), results)
    assert not report.ok and report.exit_code == 1
    assert status_footer(report) == ("1 of 5 host(s) fine; MIXED: 1 (b); drifted files: 2 (c, d); serving stale "
                                     "code: 1 (c); unreachable: 1 (e)")
