"""The speed gate's decisions without a host (serve/bake.py): where the baseline comes from,
what a bake decides and says, what the history keeps and reads back; and bad ``[analysis]``
input refused before any connection (one line, exit 2).

The windows here are ``ServedFigures`` values built in the test (the same type the serve
program's scrapes parse into): the sampler is bake.py's seam for "take N windows", so these
tests feed it windows of known speed. Over real sshd with the stand-in server:
tests/e2e/test_speed_gate_ssh.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sshd_host import cli

from ddtree_deploy.serve import bake
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.settings.analysis import AnalysisSettings

SETTINGS = AnalysisSettings(window_s=6, interval_s=1, min_samples=4)


def window(tps: float, *, idle: bool = False, i: int = 0) -> ServedFigures:
    wobble = (-1, 1, 0, 2, -2, 0)[i % 6] * tps * 0.005  # a little noise, median 0: the analysis needs some spread
    if idle:
        return ServedFigures(window_s=1.0, release="0.5.12.post1", algorithm="DDTREE", budget=8)
    return ServedFigures(window_s=1.0, release="0.5.12.post1", algorithm="DDTREE", budget=8, accept_length=3.0,
                         output_tps=tps + wobble, running=4, itl_p99_ms=8.0 * 1000 / (tps + wobble), requests=10,
                         aborted=0, request_rate=10.0, error_rate=0.0)


WARM_UP = ServedFigures(window_s=1.0, release="0.5.12.post1", algorithm="DDTREE", budget=8, accept_length=1.5,
                        output_tps=100.0, running=4, itl_p99_ms=80.0, requests=1, request_rate=1.0, error_rate=0.0)


def sampler_of(*sides):
    """A sampler that answers each call with the next side's windows (and counts its calls)."""
    calls = []

    def take(interval_s: float, scrapes: int):
        calls.append((interval_s, scrapes))
        return sides[len(calls) - 1][: scrapes - 1]
    take.calls = calls
    return take


def busy(tps: float, n: int = 6) -> list:
    return [window(tps, i=i) for i in range(n)]


def restarted(tps: float, n: int = 6) -> list:
    """A server just restarted: its first window (gauges from zero), then ``n`` busy ones."""
    return [WARM_UP] + busy(tps, n)


def test_a_live_baseline_then_a_slower_bake_fails_naming_the_figure_and_the_baseline():
    take = sampler_of(busy(1000), restarted(880))
    base = bake.measure_baseline(take, SETTINGS)
    assert base.source == bake.LIVE and len(base.windows) == 6 and take.calls == [(1, 7)]
    speed = bake.bake(take, SETTINGS, base)
    assert take.calls == [(1, 7), (1, 8)] and len(speed.windows) == 6 and WARM_UP not in speed.windows
    assert not speed.ok and speed.outcome == bake.ROLLED_BACK and speed.cause == "fail"
    assert speed.why().startswith("slower than the baseline: output tokens/s 880 is 12.0% below the baseline's "
                                  "1,000 (limit -5%"), speed.why()
    record = speed.record()
    assert record["stage"] == "verdict" and record["outcome"] == "rolled back" and "windows" not in record
    assert record["before"]["output_tps"] == pytest.approx(1000) and record["after"]["output_tps"] == pytest.approx(880)


def test_an_equal_bake_is_promoted_and_its_line_is_the_before_after_line():
    take = sampler_of(busy(1000), restarted(1000))  # the warm-up window is not judged
    speed = bake.bake(take, SETTINGS, bake.measure_baseline(take, SETTINGS))
    assert speed.ok and speed.outcome == bake.PROMOTED
    assert speed.line().startswith("serving DDTree B=8: accept length 3.0 (was 3.0), 1,000 tok/s (was 1,000, +0.0%)")
    assert speed.line().endswith(": promoted")
    assert len(speed.record()["windows"]) == 6  # kept: a later push's baseline


def test_an_idle_old_server_falls_back_to_the_last_promoted_bake_in_the_history():
    promoted = bake.bake(sampler_of(restarted(1000)), SETTINGS,
                         bake.measure_baseline(sampler_of(busy(1000)), SETTINGS))
    entries = [  # newest first, as the agent answers
        {"event": "speed", "run_id": "r3", "time": "t3", "speed": {"stage": "verdict", "outcome": "rolled back"}},
        {"event": "push", "run_id": "r2"},
        {"event": "speed", "run_id": "r1", "time": "t1", "speed": promoted.record()},
    ]
    recorded = bake.recorded_baseline(entries)
    assert recorded is not None and recorded.source == bake.RECORD and recorded.run_id == "r1"
    assert all(isinstance(w, ServedFigures) for w in recorded.windows) and len(recorded.windows) == 6
    idle = [window(0, idle=True) for _ in range(6)]
    base = bake.measure_baseline(sampler_of(idle), SETTINGS, recorded=recorded)
    assert base is recorded and "the old server had no traffic: the baseline is push run r1's bake" in base.note
    speed = bake.bake(sampler_of(restarted(880)), SETTINGS, base)
    assert not speed.ok and "below the baseline's 1,000" in speed.why()
    # nothing recorded: a baseline of none, and the bake is inconclusive (counted as a failure)
    none = bake.measure_baseline(sampler_of(idle), SETTINGS)
    assert none.source == bake.NONE and "the old server had 0 windows with traffic" in none.note
    speed = bake.bake(sampler_of(restarted(1000)), SETTINGS, none)
    assert not speed.ok and speed.cause == "inconclusive" and "history holds no promoted deploy" in speed.why()


def test_a_run_finds_its_own_baseline_after_ctrl_c():
    base = bake.measure_baseline(sampler_of(busy(1000)), SETTINGS)
    entries = [{"event": "speed", "speed": {"stage": "baseline", "push_run": "other", "baseline": {}}},
               {"event": "speed", "speed": {"stage": "baseline", "push_run": "mine", "baseline": base.to_json()}}]
    found = bake.pending_baseline(entries, "mine")
    assert found is not None and found.source == bake.LIVE and found.windows == base.windows
    assert bake.pending_baseline(entries, "nobody") is None


def test_a_server_that_stops_answering_fails_the_bake_and_says_why():
    gone = Unavailable("http://127.0.0.1:1/metrics did not answer: connection refused")
    speed = bake.bake(sampler_of(restarted(1000)[:3] + [gone]), SETTINGS, bake.measure_baseline(sampler_of(busy(1000)),
                                                                                          SETTINGS))
    assert not speed.ok and speed.cause == "server died"
    assert speed.why() == "the server stopped answering during the bake: " + gone.line


def test_the_fleet_table_cell_and_the_history_words():
    speed = bake.bake(sampler_of(restarted(880)), SETTINGS, bake.measure_baseline(sampler_of(busy(1000)), SETTINGS))
    cell = bake.speed_cell(speed.to_json())
    assert cell.startswith("1,000 -> 880 tok/s (-12.0%), accept 3.0 -> 3.0, p99 ITL 8 -> 9 ms") and \
        cell.endswith(": rolled back"), cell
    assert bake.speed_cell(bake.skipped().to_json()) == "skipped (--no-analysis)"
    assert bake.speed_cell(None) == ""
    around = bake.around_record(window(1000, i=2), window(1100, i=2))
    assert bake.entry_words(around).startswith("after: DDTree B=8: accept length 3.0 (was 3.0), 1,100 tok/s (was "
                                               "1,000, +10.0%)")


# ---------------------------------------------------------------- bad [analysis]: one line, exit 2, nothing sent


def _host_file(tmp_path: Path, analysis: str) -> Path:
    # Port 1 on loopback: nothing listens; a command that connected would fail there, not with exit 2.
    path = tmp_path / "gated.toml"
    path.write_text('transport = "ssh"\n[ssh]\nhost = "127.0.0.1"\nport = 1\n[host]\npython = "python3"\n'
                    'state_dir = "/tmp/never"\n[serve]\nrestart = ["true"]\nurl = "http://127.0.0.1:30000"\n'
                    + analysis)
    return path


@pytest.mark.parametrize("command", ["push", "restart", "rollback"])
def test_a_bad_analysis_table_is_one_line_exit_2_before_any_connection(tmp_path, command):
    host = _host_file(tmp_path, '[analysis]\n[analysis.thresholds]\noutput_tps = "+5%"\n')
    r = cli(command, "--host", str(host))
    assert r.exit_code == 2, r.output
    assert "gated.toml: line 13: analysis.thresholds.output_tps: '+5%' would demand a rise" in r.stderr, r.stderr
    assert "127.0.0.1" not in r.stderr and "connect" not in r.stderr.lower()


def test_a_bad_analysis_override_is_one_line_exit_2_before_any_connection(tmp_path):
    host = _host_file(tmp_path, "[analysis]\nwindow_s = 120\n")
    r = cli("push", "--host", str(host), "--analysis", "interval_s=500")
    assert r.exit_code == 2, r.output
    assert r.stderr == ("error: --analysis: analysis.interval_s: 500 s is longer than window_s 120 s; make the "
                        "interval at most the window\n"), r.stderr
    r = cli("push", "--host", str(host), "--analysis", "nonsense")
    assert r.exit_code == 2 and "--analysis: 'nonsense' is not KEY=VALUE" in r.stderr, r.stderr


def test_analysis_without_serve_is_said_by_push_and_hosts_list(tmp_path, monkeypatch):
    """[analysis] on a host without [serve] measures nothing (nothing says where its server
    listens): push warns before it connects, `hosts list` names it (text and JSON)."""
    folder = tmp_path / "hosts"
    folder.mkdir()
    path = folder / "bare.toml"
    path.write_text('transport = "ssh"\n[ssh]\nhost = "127.0.0.1"\nport = 1\n[host]\npython = "python3"\n'
                    'state_dir = "/tmp/never"\n[analysis]\nwindow_s = 120\n')
    said = f"{path}: [analysis] has no effect: the host has no [serve] table"
    r = cli("push", "--host", str(path), "--no-smoke")
    assert r.exit_code != 0  # nothing listens on port 1: the push itself fails, after the warning
    assert said in " ".join(r.stderr.split()), r.stderr
    r = cli("hosts", "list", "-i", str(folder))
    assert r.exit_code == 0, r.output
    assert "WARNING: " + said in " ".join(r.stdout.split()) + " ".join(r.stderr.split()), r.output
    import json

    doc = json.loads(cli("hosts", "list", "-i", str(folder), "--json").stdout)
    assert doc["inventory"][0]["warning"].startswith(said)
    # with [serve] (or an --analysis override on such a host, pushed with --no-analysis): nothing said
    r = cli("push", "--host", str(path), "--no-smoke", "--no-analysis")
    assert "has no effect" not in r.stderr
