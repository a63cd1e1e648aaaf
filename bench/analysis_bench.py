"""The speed gate's noise figures: false rollbacks of equal builds and detection of a slower one.

    python -m bench analysis_bench

A deterministic simulation (ddtree_testkit/analysis_sim.py: the stand-in server's model
with per-window noise, seeded) runs the analysis (ddtree_deploy/serve/analysis.py) with
the default ``[analysis]`` settings many times, for equal builds and for builds 5%, 10%
and 20% slower, at two noise levels: low (``QUIET``) and the noise
turned up (``LOUD``: tokens/s +/-5% per window, p99 ITL +/-10%, p99 TTFT +/-20%, one window
in 20 hit by a burst, one in 20 idle). Each line: how many verdicts rolled back, of how
many. Also: the same with shorter bakes, to show what the default window buys. The rates
are the same on every machine (seeded); only the time taken varies.
"""

from __future__ import annotations

import dataclasses
import time

from ddtree_deploy.settings.analysis import AnalysisSettings
from ddtree_testkit.analysis_sim import LOUD, QUIET, rates

TRIALS = 2000


def line(settings: AnalysisSettings, noise_name: str, noise, slowdown: float, trials: int = TRIALS) -> str:
    r = rates(settings, noise, slowdown, trials=trials)
    what = "equal builds: false rollbacks" if slowdown == 0 else f"{slowdown:.0%} slower: detected"
    return (f"  {noise_name:<5} {what:<30} {r.rolled_back:>5} / {r.trials} = {r.rate:6.2%}"
            + (f"  ({r.inconclusive} inconclusive)" if r.inconclusive else ""))


def main() -> None:
    defaults = AnalysisSettings()
    started = time.perf_counter()
    print(f"defaults: window {defaults.window_s:g} s, interval {defaults.interval_s:g} s ({defaults.samples} samples a "
          f"side), min_samples {defaults.min_samples}, margin {defaults.margin:g}")
    for name, noise in (("quiet", QUIET), ("loud", LOUD)):
        for slowdown in (0.0, 0.05, 0.10, 0.20):
            print(line(defaults, name, noise, slowdown), flush=True)
    for window in (60.0, 120.0):
        # min_samples at half the samples, as the defaults have it (an idle window leaves slack)
        shorter = dataclasses.replace(defaults, window_s=window, min_samples=int(window // defaults.interval_s) // 2)
        print(f"window {window:g} s ({shorter.samples} samples a side):")
        for slowdown in (0.0, 0.10):
            print(line(shorter, "loud", LOUD, slowdown), flush=True)
    print(f"({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
