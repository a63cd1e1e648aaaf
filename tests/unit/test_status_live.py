"""`status`'s live DDTree line, the pure part (ddtree_deploy/serve/live.py) and its bad input:
since when a server runs its code (from ``serve_plan.serving``'s processes and the journal's
serve record), the line for figures, for an idle window and for a server without metrics, the
JSON form against ``$defs/live``, and ``--window`` refused in one line (exit 2) before any
host is read. The line over a real sshd with the stand-in server: tests/e2e/test_status_live_ssh.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from typer.testing import CliRunner

from ddtree_deploy.cli import app
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.serve.live import DEFAULT_WINDOW_S, Live, Since, check_window, since_of
from ddtree_deploy.base.errors import BadInput

DEFS = json.loads((Path(__file__).resolve().parent.parent.parent / "docs" / "json-schema.json").read_text())["$defs"]


def valid(doc: dict) -> None:
    jsonschema.validate(doc, {"$ref": "#/$defs/live", "$defs": DEFS})


def proc(pid: int, started: float, *, stale: bool = False, decided_by: str = "time", undecided: str | None = None):
    return {"pid": pid, "started": started, "started_iso": f"T{started:g}", "stale": stale, "decided_by": decided_by,
            "undecided": undecided, "before_files": stale or undecided is not None}


FIGS = ServedFigures(window_s=2.01, release="0.5.23", algorithm="DDTREE", budget=64, topk=8, verify_width=65,
                     accept_length=3.41, output_tps=1210.4, running=31.0, itl_p50_ms=12.3, itl_p99_ms=41.2,
                     requests=4, request_rate=1.99, error_rate=0.0)


def test_since_is_the_oldest_process_and_names_the_restart_that_started_it():
    serving = {"processes": [proc(7, 200.0), proc(5, 100.0)]}
    journal = {"serve": {"pids": [5], "restart_run": "r1", "state": "healthy", "time": "T150"}}
    s = since_of(serving, journal)
    assert s == Since(started="T100", pid=5, current=True, decided_by="time", restart_run="r1",
                      restart_state="healthy", restart_time="T150")
    assert s.text() == "serving this code since T100 (pid 5, restarted by run r1, healthy)"
    # A process the record does not name (started by hand): no restart claimed for it.
    assert since_of(serving, {"serve": {"pids": [9], "restart_run": "r1"}}).restart_run is None
    assert since_of(serving, None).text() == "serving this code since T100 (pid 5)"


def test_since_says_older_code_and_why_the_times_decided():
    s = since_of({"processes": [proc(5, 100.0, stale=True, undecided="the history was rotated away")]}, {})
    assert s.current is False
    assert s.text() == ("serving code OLDER than the files since T100 (pid 5, judged by the times: the history was "
                        "rotated away)")
    assert since_of({"processes": [proc(5, 1.0, decided_by="content")]}, {}).text() == \
        "serving this code since T1 (pid 5)"
    assert since_of({"processes": []}, {}) is None and since_of(None, None) is None


def test_the_line_gives_every_figure_the_window_and_since():
    live = Live(window_s=2.0, figures=FIGS, since=Since("T1", 5, True, "content"), url="http://127.0.0.1:30000")
    assert live.line() == ("DDTree B=64/K=8: accept length 3.4, 1,210 tok/s, 31 running, ITL p50 12 ms / p99 41 ms, "
                           "2.0 req/s (window 2.0 s: two scrapes); serving this code since T1 (pid 5)")
    doc = live.to_json()
    valid(doc)
    assert doc["figures"] == FIGS.to_json() and doc["line"] == live.line() and doc["since"]["pid"] == 5
    assert Live(2.0, FIGS, None).line().endswith("(window 2.0 s: two scrapes); no serving process found")
    valid(Live(2.0, FIGS, None).to_json())
    with pytest.raises(jsonschema.ValidationError):
        valid(dict(doc, since={"pid": "five"}))


def test_an_idle_window_and_a_window_without_tokens_say_so():
    idle = ServedFigures(window_s=2.0, release="0.5.23", algorithm="DDTREE", budget=64, topk=8, running=0.0)
    assert Live(2.0, idle, None).line().startswith("DDTree B=64/K=8: idle: no request finished or running "
                                                   "(window 2.0 s: two scrapes)")
    quiet = ServedFigures(window_s=2.0, release="0.5.23", algorithm="DDTREE", budget=64, topk=8, running=2.0,
                          accept_length=3.0, output_tps=50.0)
    assert "2 running, ITL: no token in the window" in Live(2.0, quiet, None).line()


def test_a_server_without_metrics_names_the_flag():
    why = Unavailable("http://h:1/metrics answered 404: the server runs without --enable-metrics",
                      hint="add --enable-metrics to the server's launch command to see its figures")
    live = Live(2.0, why, Since("T1", 5, True, "time"))
    assert live.line() == ("no figures: http://h:1/metrics answered 404: the server runs without --enable-metrics; "
                           "add --enable-metrics to the server's launch command to see its figures; serving this "
                           "code since T1 (pid 5)")
    valid(live.to_json())


@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), 121.0])
def test_a_bad_window_is_refused(value):
    with pytest.raises(BadInput) as exc:
        check_window(value)
    assert "--window" in exc.value.message and "from 0 (no live line) to 120" in exc.value.message
    assert check_window(0) == 0.0 and check_window(DEFAULT_WINDOW_S) == 2.0


@pytest.mark.parametrize("value", ["-1", "nan", "500"])
def test_status_refuses_a_bad_window_in_one_line_before_any_host(value, tmp_path, monkeypatch):
    monkeypatch.setenv("DDTREE_DEPLOY_HOSTS", str(tmp_path))  # no inventory at all: nothing is read
    r = CliRunner().invoke(app, ["status", "--host", "nosuch", "--window", value])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert "--window" in lines[0] and "nosuch" not in r.output, r.output
    doc = json.loads(CliRunner().invoke(app, ["status", "--host", "nosuch", "--window", value, "--json"]).stdout)
    assert doc["exit_code"] == 2 and doc["error"]["code"] == "bad-input" and "--window" in doc["error"]["message"]
