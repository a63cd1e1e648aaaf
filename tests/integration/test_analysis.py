"""The speed gate, pure: the ``[analysis]`` table (settings/analysis.py: defaults, bad
values in one line naming file, line and key, the override shape) and the judgement
(serve/analysis.py: pass, fail naming the figure, by how much and the baseline,
inconclusive on too few samples), then the noise figures of the defaults on the
deterministic simulation (ddtree_testkit/analysis_sim.py; bench/analysis_bench.py prints
the full table).
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.serve import analysis, metrics
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.settings import analysis as st
from ddtree_deploy.settings.inventory import load_host
from ddtree_testkit import analysis_sim as sim
from ddtree_testkit.standin_metrics import ITL_BUCKETS

HOST = textwrap.dedent("""\
    [host]
    python = "/usr/bin/python3"

    [ssh]
    host = "gpu1.example"
    """)


def host_file(tmp_path: Path, analysis_toml: str) -> Path:
    path = tmp_path / "ct200.toml"
    path.write_text(HOST + textwrap.dedent(analysis_toml))
    return path


def parsed(tmp_path: Path, analysis_toml: str) -> st.AnalysisSettings | None:
    host = load_host(str(host_file(tmp_path, analysis_toml)))
    return st.parse_analysis(host.analysis, source=host.source)


# ----------------------------------------------------------------------------- the table


def test_no_table_is_no_analysis_and_an_empty_one_is_the_defaults(tmp_path):
    assert parsed(tmp_path, "") is None
    s = parsed(tmp_path, "[analysis]\n")
    assert s == st.AnalysisSettings()
    assert (s.window_s, s.interval_s, s.samples, s.min_samples, s.margin) == (180.0, 10.0, 18, 9, 3.5)
    assert [t.describe() for t in s.thresholds] == ["-5% of the baseline", "-5% of the baseline",
                                                    "+10% of the baseline", "+25% of the baseline", "<= 0.01"]


def test_a_full_table(tmp_path):
    s = parsed(tmp_path, """
        [analysis]
        window_s = 60
        interval_s = 5
        min_samples = 8
        margin = 2

        [analysis.thresholds]
        accept_length = 2.5
        output_tps = ["-3%", 800]
        itl_p99_ms = "10%"
        ttft_p99_ms = false
        error_rate = "+50%"

        [analysis.load]
        prompts = "prompts/chat.jsonl"
        concurrency = 32
        when = "always"
        """)
    assert (s.window_s, s.interval_s, s.samples, s.min_samples, s.margin) == (60.0, 5.0, 12, 8, 2.0)
    assert s.threshold("accept_length") == st.Threshold("accept_length", absolute=2.5)
    assert s.threshold("output_tps") == st.Threshold("output_tps", relative_pct=3.0, absolute=800.0)
    assert s.threshold("itl_p99_ms").relative_pct == 10.0 and s.threshold("ttft_p99_ms") is None
    assert s.threshold("error_rate") == st.Threshold("error_rate", relative_pct=50.0)
    assert s.load == st.LoadStep(prompts="prompts/chat.jsonl", concurrency=32, output_len=256, when="always")
    assert s.to_json()["thresholds"]["output_tps"] == {"relative_pct": 3.0, "absolute": 800.0}


@pytest.mark.parametrize("toml, line, says", [
    ("[analysis]\nwindow_s = 0\n", 7, "analysis.window_s: must be a number of seconds above 0 and at most 3600"),
    ("[analysis]\nwindow_s = 30\ninterval_s = 60\n", 8, "analysis.interval_s: 60 s is longer than window_s 30 s"),
    ("[analysis]\ninterval_s = 0.5\n", 7, "analysis.interval_s: must be at least 1 second"),
    ("[analysis]\nwindow_s = 30\n", 6, "analysis.min_samples: 9 samples cannot fit: window_s 30 / interval_s 10 "
                                       "gives 3"),
    ("[analysis]\nmin_samples = 2\n", 7, "analysis.min_samples: must be an integer from 3 to 1000"),
    ("[analysis]\nmargin = -1\n", 7, "analysis.margin: must be a non-negative number of at most 10"),
    ("[analysis]\nwindw_s = 60\n", 7, "analysis.windw_s: unknown key"),
    ("[analysis.thresholds]\noutput_tps = \"+5%\"\n", 7, "analysis.thresholds.output_tps: '+5%' would demand a "
                                                         "rise"),
    ("[analysis.thresholds]\nitl_p99_ms = \"fast\"\n", 7, "analysis.thresholds.itl_p99_ms: 'fast' is not a "
                                                          "percentage"),
    ("[analysis.thresholds]\nerror_rate = 5\n", 7, "analysis.thresholds.error_rate: 5: one absolute limit from "
                                                   "0 to 1"),
    ("[analysis.thresholds]\nthroughput = \"-5%\"\n", 7, "analysis.thresholds.throughput: unknown key"),
    ("[analysis.load]\nconcurrency = 4\n", 6, "analysis.load.prompts: missing (required)"),
    ("[analysis.load]\nprompts = \"p.jsonl\"\nwhen = \"never\"\n", 8, "analysis.load.when: must be one of 'idle', "
                                                                      "'always'"),
])
def test_bad_values_are_one_line_naming_file_line_and_key(tmp_path, toml, line, says):
    with pytest.raises(BadInput) as exc:
        parsed(tmp_path, toml)
    message = str(exc.value)
    assert message.startswith(f"{tmp_path / 'ct200.toml'}: line {line}: {says}"), message
    assert "\n" not in message and "; " in message  # what is wrong; what to do


def test_overrides_lay_over_the_table_and_name_their_source(tmp_path):
    host = load_host(str(host_file(tmp_path, "[analysis]\nwindow_s = 120\n")))
    pairs = [st.parse_override(x) for x in ("interval_s=5", "thresholds.output_tps=-3%", "thresholds.ttft_p99_ms=false",
                                            "load.prompts=\"p.jsonl\"", "load.concurrency=8")]
    s = st.apply_overrides(host.analysis, pairs, source=host.source)
    assert (s.window_s, s.interval_s) == (120.0, 5.0)  # the file's window kept, the interval overridden
    assert s.threshold("output_tps").relative_pct == 3.0 and s.threshold("ttft_p99_ms") is None
    assert s.load.prompts == "p.jsonl" and s.load.concurrency == 8
    assert s.source == f"{host.source} with --analysis"
    # A fleet file's table (typed values) works the same; no table and no overrides: no analysis.
    assert st.apply_overrides({}, {"window_s": 90}, source="x", override_source="fleet.toml [analysis]").window_s == 90
    assert st.apply_overrides({}, [], source="x") is None
    with pytest.raises(BadInput, match=r"^--analysis: analysis.interval_s: 500 s is longer than window_s 120 s"):
        st.apply_overrides(host.analysis, [st.parse_override("interval_s=500")], source=host.source)
    with pytest.raises(BadInput, match=r"^--analysis: 'window_s' is not KEY=VALUE"):
        st.parse_override("window_s")
    # The host's own table is checked first: its message names its file.
    bad = load_host(str(host_file(tmp_path, "[analysis]\nmargin = 99\n")))
    with pytest.raises(BadInput, match=r"ct200.toml: line 7: analysis.margin"):
        st.apply_overrides(bad.analysis, [("window_s", 60)], source=bad.source)


# ----------------------------------------------------------------------------- the judgement


def windows(tps, *, itl=40.0, accept=3.4, ttft=500.0, error=0.0, requests=20):
    return [ServedFigures(window_s=10, release="0.5.23", algorithm="DDTREE", budget=64, topk=8, output_tps=t,
                          accept_length=accept, itl_p99_ms=itl, ttft_p99_ms=ttft, running=30, requests=requests,
                          request_rate=requests / 10, error_rate=error)
            for t in tps]


SETTINGS = st.AnalysisSettings(window_s=100, interval_s=10, min_samples=5)


def test_equal_builds_pass_and_the_line_is_before_after():
    base = windows([1000, 1010, 990, 1005, 995, 1002, 998, 1001, 999, 1003])
    new = windows([1001, 1009, 991, 1004, 996, 1000, 997, 1002, 998, 1006])
    v = analysis.analyse(base, new, SETTINGS)
    assert v.outcome == analysis.PASS and v.ok and v.samples == (10, 10)
    assert v.reason == "5 figures within their limits over 10 + 10 windows"
    assert v.line() == ("DDTree B=64/K=8: accept length 3.4 (was 3.4), 1,000 tok/s (was 1,000, +0.0%) at 30 running, "
                        "p99 ITL 40 ms (was 40), 2.0 req/s (window 100 s)")  # the medians, over the bake


def test_a_slower_build_fails_naming_the_figure_the_change_and_the_baseline():
    base = windows([1000, 1010, 990, 1005, 995, 1002, 998, 1001, 999, 1003])
    new = windows([900, 905, 895, 902, 898, 901, 899, 903, 897, 900], itl=46.0)
    v = analysis.analyse(base, new, SETTINGS)
    assert v.outcome == analysis.FAIL and not v.ok
    assert [j.figure for j in v.failures] == ["output_tps", "itl_p99_ms"]
    tps = v.failures[0]
    assert tps.baseline == 1000.5 and tps.new == 900.0 and tps.worse_pct == pytest.approx(10.04, abs=0.01)
    assert tps.why.startswith("output tokens/s 900 is 10.0% below the baseline's 1,000 (limit -5%, noise ")
    assert v.line().startswith("slower than the baseline: output tokens/s 900 is 10.0% below")
    assert "p99 ITL 46.0 ms is 15.0% above the baseline's 40.0 ms (limit +10%" in v.line()


def test_a_regression_inside_the_noise_is_not_proven():
    # 8% worse in the medians, but the windows scatter by +/-15%: within `margin` standard errors.
    base = windows([1000, 1150, 850, 1100, 900, 1000, 1120, 880, 1050, 950])
    new = windows([920, 1070, 770, 1020, 820, 920, 1040, 800, 970, 870])
    v = analysis.analyse(base, new, SETTINGS)
    j = next(j for j in v.judgements if j.figure == "output_tps")
    assert j.worse_pct > 5 and j.worse_pct < SETTINGS.margin * j.noise_pct and not j.failed
    assert v.outcome == analysis.PASS
    # With no margin for the noise the same windows fail: the margin is what held it.
    assert analysis.analyse(base, new, dataclasses.replace(SETTINGS, margin=0)).outcome == analysis.FAIL


def test_absolute_limits_and_figures_not_measured():
    s = dataclasses.replace(SETTINGS, thresholds=(st.Threshold("accept_length", absolute=3.5),
                                                  st.Threshold("error_rate", absolute=0.01)))
    base = windows([1000] * 10)
    new = windows([1000] * 10, accept=3.2)
    v = analysis.analyse(base, new, s)
    assert v.outcome == analysis.FAIL and v.failures[0].why == ("accept length 3.20 is below the limit 3.50, the "
                                                               "baseline's 3.40")
    # No speculation on either side: no accept length to judge, so only the error rate is.
    none = [dataclasses.replace(w, accept_length=None) for w in base]
    v = analysis.analyse(none, none, s)
    assert v.outcome == analysis.PASS
    assert "accept length: measured in 0 baseline and 0 new windows, fewer than the 5 needed: not judged" in \
        [j.why for j in v.judgements]


def test_too_few_samples_is_inconclusive_and_idle_windows_are_no_samples():
    base = windows([1000] * 10)
    idle = [ServedFigures(window_s=10, release="0.5.23", running=0, requests=0)] * 7
    new = windows([1000] * 3) + idle + [Unavailable("the server restarted during the window")]
    v = analysis.analyse(base, new, SETTINGS)
    assert v.outcome == analysis.INCONCLUSIVE and not v.ok and v.samples == (10, 3)
    assert v.reason.startswith("the new server had 3 windows with traffic, fewer than the 5 needed")
    assert v.line().startswith("speed not proven (inconclusive, counted as a failure): ")
    assert v.to_json()["outcome"] == "inconclusive"


# ----------------------------------------------------------------------------- a histogram's resolution


def histogram_windows(tps, itl_ms):
    """Windows whose p99 ITL is read as a host's is: from the cumulative bucket counts of
    SGLang's default ITL bounds (the stand-in's), through serve/metrics.py's interpolation,
    with the width of the bucket it lies in. ``itl_ms``: every step's inter-token latency in
    the window (200 tokens each)."""
    out = []
    for t in tps:
        after = {b: (200.0 if itl_ms <= b * 1000 else 0.0) for b in ITL_BUCKETS + (float("inf"),)}
        p99, width = metrics.quantile_in_bucket({}, after, 0.99)
        out.append(dataclasses.replace(windows([t])[0], itl_p99_ms=p99 * 1000, itl_p99_bucket_ms=width * 1000))
    return out


def test_an_equal_build_whose_p99_moves_one_bucket_is_not_failed_by_it():
    """The stand-in's case (docs/analysis.md's rollback transcript): every step takes about 8
    ms, so every window interpolates to the same p99: 7.98 ms while steps take 7.9 ms
    (bucket 6-8 ms), 9.98 ms once they take 8.1 ms (bucket 8-10 ms). The windows agree
    exactly, the measured noise is 0, and a 2.5% change reads as +25%."""
    tps = [1000, 1010, 990, 1005, 995, 1002, 998, 1001, 999, 1003]
    base, new = histogram_windows(tps, 7.9), histogram_windows(tps, 8.1)
    assert [round(w.itl_p99_ms, 6) for w in base + new] == [7.98] * 10 + [9.98] * 10
    assert [round(w.itl_p99_bucket_ms, 6) for w in base + new] == [2.0] * 20
    v = analysis.analyse(base, new, SETTINGS)
    itl = next(j for j in v.judgements if j.figure == "itl_p99_ms")
    assert itl.judged and not itl.failed and itl.worse_pct == pytest.approx(25.06, abs=0.01)
    # the floor: sqrt((2^2 + 2^2) / 12) = 0.816 ms, 10.2% of 7.98 ms; 3.5 of them is 35.7%
    assert analysis.resolution_se("itl_p99_ms", base, new) == pytest.approx(0.8165, abs=1e-4)
    assert itl.noise_pct == pytest.approx(10.23, abs=0.01)
    assert v.outcome == analysis.PASS
    # Without the histogram's resolution (the windows' own spread only, 0 here) the same
    # bake fails on that bucket: the floor is what holds it.
    blind = [dataclasses.replace(w, itl_p99_bucket_ms=None) for w in base + new]
    v = analysis.analyse(blind[:10], blind[10:], SETTINGS)
    assert v.outcome == analysis.FAIL and [j.figure for j in v.failures] == ["itl_p99_ms"]
    assert "noise 0.0%" in v.failures[0].why
    # A side without widths (a baseline from a history written before the floor) adds
    # nothing: the other side's resolution alone; a figure not read from a histogram has none.
    assert analysis.resolution_se("itl_p99_ms", blind[:10], new) == pytest.approx(2.0 / 12 ** 0.5)
    assert analysis.resolution_se("output_tps", base, new) == 0.0


def test_a_real_10_percent_slower_build_still_fails_and_a_large_itl_rise_fails_on_itl():
    base = histogram_windows([1000, 1010, 990, 1005, 995, 1002, 998, 1001, 999, 1003], 7.9)
    # 10% slower: its steps take 8.8 ms (+11%), its tokens/s drop 10%. The p99 ITL moves one
    # bucket, which the histogram cannot tell from noise; the tokens/s (a gauge) prove it.
    slower = histogram_windows([900, 905, 895, 902, 898, 901, 899, 903, 897, 900], 8.8)
    v = analysis.analyse(base, slower, SETTINGS)
    assert v.outcome == analysis.FAIL and [j.figure for j in v.failures] == ["output_tps"]
    # A p99 ITL rise past the histogram's resolution fails on the ITL itself, tokens/s equal:
    # 7.98 -> 14.95 ms (bucket 10-15 ms), +87% against 3.5 x a floor of sqrt((2^2 + 5^2) / 12) = 19.5%.
    worse = histogram_windows([1000, 1010, 990, 1005, 995, 1002, 998, 1001, 999, 1003], 14.0)
    v = analysis.analyse(base, worse, SETTINGS)
    assert v.outcome == analysis.FAIL and [j.figure for j in v.failures] == ["itl_p99_ms"]
    assert v.failures[0].why == "p99 ITL 14.9 ms is 87.3% above the baseline's 7.98 ms (limit +10%, noise 19.5%)"


def test_a_quantile_knows_the_width_of_its_bucket():
    before = {0.01: 0.0, 0.02: 0.0, float("inf"): 0.0}
    assert metrics.quantile_in_bucket(before, {0.01: 50.0, 0.02: 100.0, float("inf"): 100.0}, 0.99) == \
        (pytest.approx(0.0198), pytest.approx(0.01))
    # past the last finite bound: that bound, known to no better than the last bucket's width
    assert metrics.quantile_in_bucket(before, {0.01: 0.0, 0.02: 0.0, float("inf"): 10.0}, 0.99) == \
        (pytest.approx(0.02), pytest.approx(0.01))
    assert metrics.quantile_in_bucket(before, before, 0.99) is None


# ----------------------------------------------------------------------------- the noise figures


def test_the_defaults_do_not_flap_on_equal_builds_and_catch_a_10_percent_slower_one():
    """The deterministic simulation (seeded): equal builds with the noise turned up are rolled
    back at most 2 times in 1000, a build 10% slower is caught in most bakes under that noise
    and in every bake at low noise (bench/analysis_bench.py prints all)."""
    defaults = st.AnalysisSettings()
    loud_equal = sim.rates(defaults, sim.LOUD, 0.0, trials=1000)
    quiet_equal = sim.rates(defaults, sim.QUIET, 0.0, trials=300)
    loud_slow = sim.rates(defaults, sim.LOUD, 0.10, trials=300)
    quiet_slow = sim.rates(defaults, sim.QUIET, 0.10, trials=300)
    print(f"\nfalse rollbacks: loud {loud_equal.rolled_back}/{loud_equal.trials}, quiet "
          f"{quiet_equal.rolled_back}/{quiet_equal.trials}; 10% slower caught: loud {loud_slow.rate:.1%}, quiet "
          f"{quiet_slow.rate:.1%}")
    assert loud_equal.rolled_back <= 2 and quiet_equal.rolled_back == 0
    assert loud_slow.rate >= 0.6 and quiet_slow.rate == 1.0


def test_the_simulation_is_deterministic_and_can_fail():
    a = sim.rates(st.AnalysisSettings(), sim.LOUD, 0.0, trials=50, seed=7)
    assert a == sim.rates(st.AnalysisSettings(), sim.LOUD, 0.0, trials=50, seed=7)
    # A gate without the noise margin and with a hair-trigger threshold flaps: the figure
    # above is the rule's doing, not the simulation's.
    twitchy = dataclasses.replace(st.AnalysisSettings(), margin=0.0,
                                  thresholds=(st.Threshold("output_tps", relative_pct=1.0),))
    assert sim.rates(twitchy, sim.LOUD, 0.0, trials=200).rate > 0.2
