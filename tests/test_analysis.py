"""The speed gate, pure: the ``[analysis]`` table (settings/analysis_settings.py: defaults, bad
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
from ddtree_deploy.serve import analysis
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.settings import analysis_settings as st
from ddtree_deploy.settings.inventory import load_host
from ddtree_testkit import analysis_sim as sim

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
