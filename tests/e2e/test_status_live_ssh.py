"""`status`'s live DDTree line end to end (issue 29 §1): the real CLI, sandbox hosts over a
real OpenSSH sshd on loopback (ddtree_deploy.sandbox) with SGLang 0.5.12.post1's real files,
each server run and restarted by a real supervisord (tests/serve_host.py).

The server is the named STAND-IN for SGLang (ddtree_testkit/standin_server.py; no GPU here)
with ``--enable-metrics``: it exports 0.5.12.post1's pinned metric names from the synthetic
speed model of ddtree_testkit/standin_metrics.py, driven by its own synthetic clients. The
line's figures must be that model's (accept length, clients running, tokens/s within the
timing overhead of a loaded machine, the ITL of one step divided among its tokens); a server
started without ``--enable-metrics`` says so and names the flag; ``--json`` carries the same
as ``$defs/live``; status stays read-only (no lock, the state folder byte-identical).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest

from envelope_check import check_envelope
from serve_host import BUDGET  # the served and sshd fixtures: conftest.py's
from sshd_host import cli

from ddtree_deploy.serve.figures import ServedFigures  # noqa: E402
from ddtree_deploy.serve.live import Live, Since  # noqa: E402
from ddtree_testkit.standin_metrics import Model, write_names  # noqa: E402

pytest.importorskip("supervisor", reason="supervisor (the test extra) runs the stand-in as a GPU host's would")
pytestmark = pytest.mark.sshd

RELEASE = "0.5.12.post1"  # the sandbox host's SGLang files
CLIENTS, TOKENS, ACCEPT, TOPK = 4, 48, 3.0, 4


def metrics_args(folder: Path) -> tuple[str, ...]:
    """The stand-in's flags for a server with metrics and its own live traffic."""
    names = folder / "names.json"
    folder.mkdir(parents=True, exist_ok=True)
    write_names(names, RELEASE)
    return ("--speculative-ddtree-topk", str(TOPK), "--enable-metrics", "--metric-names", str(names),
            "--traffic", str(CLIENTS), "--traffic-tokens", str(TOKENS), "--accept-length", str(ACCEPT))


def model() -> Model:
    return Model(names={}, model="m", algorithm="DDTREE", width=BUDGET + 1, accept_length=ACCEPT)


def status_json(*args: str) -> tuple[dict, int]:
    r = cli("status", *args, "--json")
    return check_envelope(r.stdout, r.exit_code, "status"), r.exit_code


def state_digest(folder: Path) -> dict[str, str]:
    """Every file under the host's state folder -> sha256 (what a read-only command leaves alone)."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_live_line_gives_the_models_figures_and_since_when_the_code_runs(served, tmp_path):
    s = served("live1", extra_argv=metrics_args(tmp_path / "m"))
    # A push with [serve]: the switch, then the server restarted on the new files; the journal's
    # serve record names the new pid.
    r = cli("push", "--host", s.name, "--json")
    assert r.exit_code == 0, r.output
    push = check_envelope(r.stdout, 0, "push")["hosts"][0]
    pid = s.sup.pid()
    s.wait_healthy()
    import time

    time.sleep(1.5)  # the clients' first requests finish: the gauges have a second behind them
    before = state_digest(s.host.state_dir)

    doc, code = status_json("--host", s.name, "--window", "2")
    host = doc["hosts"][0]
    assert code == 0 and host["outcome"] == "fine", host.get("attention")
    live = host["live"]
    f = live["figures"]
    print("\nlive: " + live["line"])
    assert live["window_s"] == 2.0 and live["url"] == f"http://127.0.0.1:{s.port}"
    assert f["available"] is True and f["window_s"] == pytest.approx(2.0, abs=0.5) and f["release"] == RELEASE
    assert (f["algorithm"], f["budget"], f["topk"], f["verify_width"]) == ("DDTREE", BUDGET, TOPK, BUDGET + 1)
    assert f["accept_length"] == pytest.approx(ACCEPT, abs=0.25) and f["running"] == CLIENTS
    expected = model().expected_tps(CLIENTS, TOKENS)
    assert 0.6 * expected <= f["output_tps"] <= 1.05 * expected, (f["output_tps"], expected)
    # ITL: one step of T = 20 ms x (1 + 0.02 x 4) = 21.6 ms divided among its 3 tokens = 7.2 ms
    # (sleeps overshoot: not below it, within SGLang's buckets around it).
    assert 6.0 <= f["itl_p50_ms"] <= f["itl_p99_ms"] <= 20.0, (f["itl_p50_ms"], f["itl_p99_ms"])
    assert f["requests"] > 0 and f["request_rate"] == pytest.approx(f["requests"] / f["window_s"])
    since = live["since"]
    assert since["pid"] == pid and since["current"] is True and since["undecided"] is None
    assert since["restart_run"] == push["run_id"] and since["restart_state"] == "healthy"
    # The line is the typed object's rendering.
    again = Live(window_s=live["window_s"], figures=ServedFigures.from_json(f), since=Since(**since), url=live["url"])
    assert live["line"] == again.line()
    assert re.match(rf"DDTree B={BUDGET}/K={TOPK}: accept length 3\.\d, [\d,.]+ tok/s, 4 running, "
                    r"ITL p50 \d+(\.\d)? ms / p99 \d+(\.\d)? ms, [\d.]+ req/s \(window \d\.\d s: two scrapes\); "
                    rf"serving this code since \S+ \(pid {pid}, restarted by run {push['run_id']}, healthy\)$",
                    live["line"]), live["line"]

    # The text form: the same line, under the serving block; the host's last line unchanged.
    text = cli("status", "--host", s.name, "--window", "1")
    assert text.exit_code == 0, text.output
    print(text.stdout)
    lines = text.stdout.splitlines()
    shown = [line for line in lines if line.startswith("  live: ")]
    assert len(shown) == 1 and shown[0].startswith(f"  live: DDTree B={BUDGET}/K={TOPK}: accept length "), lines
    # The window shown is the one measured between the two scrapes' midpoints, not the one asked
    # for: a loaded machine's slower first scrape showed 0.9 s for --window 1.
    measured = re.search(r"\(window (\d+\.\d) s: two scrapes\)", shown[0])
    assert measured and 0.5 <= float(measured.group(1)) <= 1.5, shown[0]
    assert f"(pid {pid}, restarted by run" in shown[0]
    assert lines.index(shown[0]) > max(i for i, line in enumerate(lines) if line.startswith("  serving: "))

    # Read-only: no lock taken, no file of the state folder written.
    assert state_digest(s.host.state_dir) == before
    assert not (s.host.state_dir / "lock").exists()


def test_a_server_without_metrics_says_so_and_names_the_flag(served):
    s = served("live2")  # the stand-in without --enable-metrics: /metrics answers 404
    doc, code = status_json("--host", s.name)
    host = doc["hosts"][0]
    live = host["live"]
    assert live["window_s"] == 2.0  # the default window
    assert live["figures"] == {"available": False,
                               "why": f"http://127.0.0.1:{s.port}/metrics answered 404: the server runs without "
                                      "--enable-metrics",
                               "hint": "add --enable-metrics to the server's launch command to see its figures"}
    assert live["since"]["pid"] == s.sup.pid() and live["since"]["restart_run"] is None  # started by hand
    # A server without metrics is not a host in trouble: the outcome is what it is without the line.
    skipped, code0 = status_json("--host", s.name, "--window", "0")
    assert "live" not in skipped["hosts"][0] and code == code0 and host["outcome"] == skipped["hosts"][0]["outcome"]
    text = cli("status", "--host", s.name).stdout
    assert (f"  live: no figures: http://127.0.0.1:{s.port}/metrics answered 404: the server runs without "
            "--enable-metrics; add --enable-metrics to the server's launch command to see its figures; serving "
            f"this code since ") in text, text


def test_a_fleet_reads_its_hosts_at_once_each_with_its_line(served, tmp_path):
    a = served("live3", extra_argv=metrics_args(tmp_path / "a"))
    b = served("live4")
    doc, _ = status_json("--host", a.name, "--host", b.name, "--window", "1")
    hosts = {h["host"]: h for h in doc["hosts"]}
    assert hosts[a.name]["live"]["figures"]["available"] is True
    assert hosts[b.name]["live"]["figures"]["available"] is False
    assert {h["wave"] for h in doc["hosts"]} == {1}  # both read in the first (only) wave: in parallel
    text = cli("status", "--host", a.name, "--host", b.name, "--window", "1").stdout
    assert re.search(rf"^{a.name}: live: DDTree B={BUDGET}/K={TOPK}: accept length ", text, re.M), text
    assert re.search(rf"^{b.name}: live: no figures: .*--enable-metrics", text, re.M), text


def test_a_server_that_is_down_says_so_in_the_line_and_status_still_reads_the_host(served):
    s = served("live5")
    port = s.port
    s.sup.stop()  # supervisord and its server gone: nothing listens on the [serve] url
    doc, code = status_json("--host", s.name, "--window", "1")
    live = doc["hosts"][0]["live"]
    assert live["figures"]["available"] is False and live["since"] is None
    assert live["figures"]["why"].startswith(f"http://127.0.0.1:{port}/metrics: nothing answered ("), live
    assert live["line"].endswith("; no serving process found")
    assert doc["hosts"][0]["phase"] is not None  # the host's own state is read as ever
