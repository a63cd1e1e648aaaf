"""The served figures (serve/metrics.py, serve/figures.py, hostprog/metrics.py): Prometheus text
as SGLang writes it -- with ``prometheus_client`` itself, the library SGLang exports with,
its collectors declared under the release's pinned names and labels -- parsed into one
window's figures, rendered in one line, and the host side's trimming of the text.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ddtree_deploy.hostprog import metrics as host_metrics
from ddtree_deploy.release.metric_names import names_for
from ddtree_deploy.serve import metrics
from ddtree_deploy.serve.figures import (ServedFigures, Unavailable, compared_line, figures_from_json, figures_line,
                                         label)

SCHED = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
TOK = ["model_name", "engine_type"]
ITL_BOUNDS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100, 0.2]
TTFT_BOUNDS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4]


class SGLangLike:
    """A registry declared as SGLang's collectors declare theirs (metrics_collector.py): the
    scheduler's gauges by rank, the tokenizer's counters and histograms (TTFT, requests and
    tokens also by ``is_streaming``), under ``release``'s pinned names."""

    def __init__(self, release: str):
        self.names = n = names_for(release)
        self.reg = r = CollectorRegistry()
        self.g = {f: Gauge(getattr(n, f), "x", SCHED, registry=r, multiprocess_mode="mostrecent")
                  for f in ("accept_length", "accept_rate", "num_draft_tokens", "gen_throughput", "running_reqs",
                            "queue_reqs") if getattr(n, f)}
        self.requests = Counter(n.requests, "x", TOK + ["is_streaming"], registry=r)
        self.aborted = Counter(n.aborted, "x", TOK, registry=r)
        self.itl = Histogram(n.itl, "x", TOK, buckets=ITL_BOUNDS, registry=r)
        self.ttft = Histogram(n.ttft, "x", TOK + ["is_streaming"], buckets=TTFT_BOUNDS, registry=r)
        # Other metrics SGLang exports beside them: the parse must pass over them.
        Gauge("sglang:token_usage", "x", SCHED, registry=r).labels("m", "unified", "0", "0", "0").set(0.4)

    def set(self, field: str, value: float, dp: str = "0", tp: str = "0") -> None:
        self.g[field].labels("m", "unified", tp, "0", dp).set(value)

    def text(self) -> str:
        return generate_latest(self.reg).decode()


def answer(*texts: str, interval: float = 10.0, info: dict | None = None) -> dict:
    return {"ok": True, "url": "http://127.0.0.1:30000", "metrics": "ok", "detail": None,
            "scrapes": [{"t": 1_800_000_000.0 + i * interval, "mono": 100.0 + i * interval, "status": 200,
                         "text": t, "error": None} for i, t in enumerate(texts)],
            "server_info": info}


INFO = {"speculative_algorithm": "DDTREE", "speculative_ddtree_budget": 64, "speculative_ddtree_topk": 8,
        "internal_states": [{"avg_spec_accept_length": 3.31, "ddtree_verify_width": 65}]}


@pytest.mark.parametrize("release", ["0.5.12.post1", "0.5.23"])
def test_one_window_from_two_scrapes(release):
    s = SGLangLike(release)
    for dp in ("0", "1"):  # two data-parallel ranks: their running requests add up
        s.set("running_reqs", 15 + int(dp), dp=dp)
        s.set("gen_throughput", 600.0 + 10 * int(dp), dp=dp)
        s.set("accept_length", 3.3 + 0.2 * int(dp), dp=dp)
        s.set("accept_rate", 0.5, dp=dp)
        s.set("queue_reqs", 1, dp=dp)
        if "num_draft_tokens" in s.g:
            s.set("num_draft_tokens", 65, dp=dp)
    s.set("running_reqs", 999, tp="1")  # a tensor-parallel rank repeats rank 0: left out
    s.requests.labels("m", "unified", "true").inc(100)
    first = s.text()
    s.set("running_reqs", 17, dp="0")  # the gauges: the mean of the two scrapes
    s.requests.labels("m", "unified", "true").inc(18)
    s.requests.labels("m", "unified", "false").inc(3)  # streaming or not: both count
    s.aborted.labels("m", "unified").inc(1)
    for _ in range(98):
        s.itl.labels("m", "unified").observe(0.012)  # the 0.010-0.015 bucket
    for _ in range(2):
        s.itl.labels("m", "unified").observe(0.09)  # the 0.080-0.100 bucket
    for _ in range(10):
        s.ttft.labels("m", "unified", "true").observe(0.3)
    f = metrics.window(answer(first, s.text(), info=INFO), s.names)
    assert isinstance(f, ServedFigures), f
    assert f.release == release and f.window_s == 10.0 and f.taken_at == "2027-01-15T08:00:10Z"
    assert f.running == pytest.approx((15 + 16 + 17 + 16) / 2)  # dp sums, averaged over the scrapes
    assert f.output_tps == pytest.approx(1210.0) and f.queue == 2.0
    assert f.accept_length == pytest.approx(3.4)  # a mean over the ranks, not a sum
    assert f.num_draft_tokens == (65.0 if release == "0.5.23" else None)  # 0.5.12.post1 has no such gauge
    assert (f.requests, f.aborted) == (21, 1)
    assert f.request_rate == pytest.approx(2.1) and f.error_rate == pytest.approx(1 / 22)
    # p50: rank 50 of 100, inside 0.010-0.015 (98 there): 10 + 5 * 50/98 ms; p99: rank 99, the
    # first of the two in 0.080-0.100: 80 + 20 * 1/2 ms (Prometheus's linear interpolation).
    assert f.itl_p50_ms == pytest.approx(10 + 5 * 50 / 98)
    assert f.itl_p99_ms == pytest.approx(90.0)
    assert f.ttft_p50_ms == pytest.approx(200 + 200 * 0.5) and f.ttft_p99_ms == pytest.approx(200 + 200 * 0.99)
    assert (f.algorithm, f.budget, f.topk, f.verify_width, f.avg_accept_length) == ("DDTREE", 64, 8, 65, 3.31)
    assert figures_line(f) == "DDTree B=64/K=8: accept length 3.4, 1,210 tok/s at 32 running, p99 ITL 90 ms, " \
                              "2.1 req/s, 4.5% aborted (window 10 s)"
    assert figures_from_json(json.loads(json.dumps(f.to_json()))) == f


def test_no_observation_is_no_percentile_and_idle_says_so():
    s = SGLangLike("0.5.23")
    s.set("running_reqs", 0)
    f = metrics.window(answer(s.text(), s.text(), info=INFO), s.names)
    assert f.itl_p99_ms is None and f.ttft_p50_ms is None and f.error_rate is None and f.request_rate == 0
    assert f.idle and figures_line(f) == "DDTree B=64/K=8: idle (no request in the window of 10 s)"


def test_quantile_edges():
    # Everything past the last finite bound: that bound (histogram_quantile's answer).
    assert metrics.quantile({}, {0.1: 0, 0.2: 0, float("inf"): 5}, 0.99) == 0.2
    assert metrics.quantile({0.1: 3, float("inf"): 3}, {0.1: 3, float("inf"): 3}, 0.5) is None  # nothing new
    assert metrics.quantile({0.1: 1, float("inf"): 1}, {0.1: 0, float("inf"): 0}, 0.5) is None  # went down
    assert metrics.quantile({}, {0.1: 4, 0.2: 4, float("inf"): 4}, 0.5) == pytest.approx(0.05)


def test_a_restart_between_the_scrapes_gives_no_window():
    s = SGLangLike("0.5.23")
    s.requests.labels("m", "unified", "true").inc(50)
    before = s.text()
    fresh = SGLangLike("0.5.23")
    fresh.requests.labels("m", "unified", "true").inc(2)
    f = metrics.window(answer(before, fresh.text()), s.names)
    assert isinstance(f, Unavailable) and "restarted during the window" in f.why


def test_a_server_without_metrics_names_the_flag():
    doc = {"ok": True, "url": "http://127.0.0.1:30000", "metrics": "missing",
           "detail": "http://127.0.0.1:30000/metrics answered 404", "scrapes": [{"status": 404, "text": None}],
           "server_info": INFO}
    f = metrics.window(doc, names_for("0.5.23"))
    assert isinstance(f, Unavailable)
    assert f.line == ("http://127.0.0.1:30000/metrics answered 404: the server runs without --enable-metrics; "
                      "add --enable-metrics to the server's launch command to see its figures")
    assert figures_line(f) == f.line and f.to_json()["available"] is False


def test_scrapes_that_stopped_and_text_that_is_not_prometheus():
    s = SGLangLike("0.5.23")
    doc = answer(s.text(), s.text(), s.text())
    doc["scrapes"].append({"status": None, "text": None, "error": "connection refused"})
    doc.update(metrics="unreachable", detail="http://127.0.0.1:30000/metrics: nothing answered (connection refused)")
    out = metrics.windows(doc, s.names)
    assert [type(w).__name__ for w in out] == ["ServedFigures", "ServedFigures", "Unavailable"]
    assert "nothing answered" in out[-1].why
    bad = metrics.windows(answer("sglang:x{le=\"1\" 1\n", s.text()), s.names)
    assert len(bad) == 1 and "not Prometheus text" in bad[0].why


def test_the_before_after_line():
    now = ServedFigures(window_s=10, release="0.5.23", algorithm="DDTREE", budget=64, topk=8, accept_length=3.4,
                        output_tps=1210.0, running=31, itl_p99_ms=41.0, requests=21, request_rate=2.1)
    was = dataclasses.replace(now, accept_length=2.9, output_tps=1020.0, itl_p99_ms=44.0)
    assert compared_line(now, was) == ("DDTree B=64/K=8: accept length 3.4 (was 2.9), 1,210 tok/s (was 1,020, "
                                       "+18.6%) at 31 running, p99 ITL 41 ms (was 44), 2.1 req/s (window 10 s)")
    assert compared_line(now, Unavailable("no metrics")) == figures_line(now)
    assert label(dataclasses.replace(now, algorithm="DFLASH")) == "DFlash chain"
    assert label(dataclasses.replace(now, algorithm=None)) == "no speculation"
    assert label(dataclasses.replace(now, topk=None)) == "DDTree B=64"


def test_the_request_asks_for_the_pinned_names_only():
    names = names_for("0.5.12.post1")
    req = metrics.scrape_request("/usr/bin/python3", "http://127.0.0.1:30000", names, interval_s=5, scrapes=3)
    assert req["op"] == "metrics" and req["scrapes"] == 3 and req["interval_s"] == 5.0
    assert "sglang:spec_num_draft_tokens" not in req["names"] and "sglang:spec_accept_length" in req["names"]
    assert metrics.scrape_deadline(req) == 2 * 5 + 5 * 10 + 30


def test_the_host_keeps_the_lines_of_the_names_asked():
    s = SGLangLike("0.5.23")
    s.itl.labels("m", "unified").observe(0.012)
    s.requests.labels("m", "unified", "true").inc(3)
    text = s.text()
    kept = host_metrics.keep_lines(text, metrics.wanted(s.names))
    assert "sglang:token_usage" in text and "sglang:token_usage" not in kept
    assert "sglang:num_requests_created" not in kept  # the counter's creation time: not read
    assert kept.count(s.names.itl + "_bucket") == len(ITL_BOUNDS) + 1
    # What the host kept parses to the same figures as the whole text.
    assert metrics.parse_text(kept).samples[s.names.itl + "_bucket"] == \
        metrics.parse_text(text).samples[s.names.itl + "_bucket"]
    assert host_metrics.keep_lines(text, None) == text
    assert host_metrics.metric_of("# TYPE sglang:x counter") == "sglang:x" and host_metrics.metric_of("# x") is None


def test_the_json_forms_are_the_schemas():
    """ServedFigures, Unavailable and the analysis Verdict against their $defs in docs/json-schema.json
    (what status and the history will reference)."""
    from pathlib import Path

    import jsonschema

    from ddtree_deploy.serve import analysis
    from ddtree_deploy.settings.analysis import AnalysisSettings

    defs = json.loads((Path(__file__).resolve().parent.parent.parent / "docs" / "json-schema.json").read_text())["$defs"]

    def check(doc, name):
        jsonschema.validate(doc, {"$ref": f"#/$defs/{name}", "$defs": defs})

    s = SGLangLike("0.5.23")
    s.set("running_reqs", 3)
    s.requests.labels("m", "unified", "true").inc(4)
    first = s.text()
    s.requests.labels("m", "unified", "true").inc(4)
    f = metrics.window(answer(first, s.text(), info=INFO), s.names)
    check(f.to_json(), "served_figures")
    check(Unavailable("no metrics", hint="add --enable-metrics").to_json(), "served_figures")
    with pytest.raises(jsonschema.ValidationError):
        check(dict(f.to_json(), output_tps="fast"), "served_figures")
    v = analysis.analyse([f] * 9, [f] * 9, AnalysisSettings())
    check(v.to_json(), "analysis_verdict")
    check(analysis.analyse([], [], AnalysisSettings()).to_json(), "analysis_verdict")
