"""The speed gate's judgement: the baseline's windows against the new build's -> a verdict.
Pure, deterministic, no I/O: the windows come in (``ServedFigures``, serve/metrics.py), a
frozen ``Verdict`` goes out.

The rule (docs/analysis.md says the same, with the figures that chose the defaults):

1. **Samples.** A sample is one window with traffic (an idle window, or one with no figures,
   is no sample). Fewer than ``min_samples`` samples on either side: the verdict is
   *inconclusive*, which the rollout treats as a failure (it cannot show the new build is
   not slower).
2. **Per figure, the median of the windows**, on each side: one slow window (a burst of long
   prompts, a GC pause) moves a median little, where it would move a mean.
3. **The noise, from the windows themselves**: one window's standard deviation ``s`` from
   every window of both sides (``pooled_sd``: deviations from each side's median, clipped
   at three robust deviations), and the standard error of the difference of the two
   medians, 1.2533 x s x sqrt(1 / n_b + 1 / n_n) (1.2533 = sqrt(pi / 2): a median's
   standard error over a mean's, for normal noise). A figure read from a histogram (p99
   ITL, p99 TTFT) has a floor under that standard error, the histogram's resolution
   (``resolution_se``): windows that interpolate inside the same bucket can agree exactly,
   which would make any bucket shift look proven.
4. **A figure fails** when it is worse than the baseline by more than its relative
   threshold AND by more than ``margin`` standard errors (both: a large regression inside
   large noise is not proven; a tiny proven one is within what the operator allows), or
   when its median is past its absolute limit. A figure either side did not measure in
   ``min_samples`` windows (no accept length without speculation, no latency without
   finished requests) is not judged, and says so.
5. **Verdict**: *fail* when any judged figure fails (each failure names the figure, by how
   much, and the baseline); *pass* otherwise; *inconclusive* when a side has too few samples
   or no figure could be judged.

Equal builds do not flap: with equal builds a median's difference stays within a few
standard errors, and the rule asks for more than ``margin`` of them AND for the threshold.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, fields, replace
from typing import Sequence

from ddtree_deploy.serve.figures import ServedFigures, Unavailable, compared_line
from ddtree_deploy.settings.analysis import FIGURES, AnalysisSettings, Threshold

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"
MAD_TO_SD = 1.4826  # the median absolute deviation of normal noise, to its standard deviation
MEDIAN_SE = 1.2533  # sqrt(pi / 2): a median's standard error over a mean's
NAMES = {"accept_length": "accept length", "output_tps": "output tokens/s", "itl_p99_ms": "p99 ITL",
         "ttft_p99_ms": "p99 TTFT", "error_rate": "error rate"}
BUCKET = {"itl_p99_ms": "itl_p99_bucket_ms", "ttft_p99_ms": "ttft_p99_bucket_ms"}  # a histogram figure's resolution
UNITS = {"accept_length": "", "output_tps": "", "itl_p99_ms": " ms", "ttft_p99_ms": " ms", "error_rate": ""}


@dataclass(frozen=True)
class Judgement:
    """One figure, judged (or why not)."""

    figure: str
    limit: str  # the threshold, in words
    baseline: float | None = None  # the baseline's median
    new: float | None = None  # the new build's median
    worse_pct: float | None = None  # how much worse than the baseline, % (negative: better)
    noise_pct: float | None = None  # the standard error of that difference, % of the baseline
    samples: tuple[int, int] = (0, 0)  # windows that measured it: (baseline, new)
    judged: bool = False
    failed: bool = False
    why: str | None = None  # the failure, or why the figure was not judged

    def to_json(self) -> dict:
        return {"figure": self.figure, "limit": self.limit, "baseline": self.baseline, "new": self.new,
                "worse_pct": self.worse_pct, "noise_pct": self.noise_pct, "samples": list(self.samples),
                "judged": self.judged, "failed": self.failed, "why": self.why}


@dataclass(frozen=True)
class Verdict:
    outcome: str  # pass | fail | inconclusive
    reason: str  # one line: what decided it
    judgements: tuple[Judgement, ...] = ()
    samples: tuple[int, int] = (0, 0)  # windows with traffic: (baseline, new)
    needed: int = 0
    baseline: ServedFigures | None = None  # the medians, for the before/after line
    new: ServedFigures | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == PASS

    @property
    def failures(self) -> tuple[Judgement, ...]:
        return tuple(j for j in self.judgements if j.failed)

    def line(self) -> str:
        """The outcome line's speed part."""
        if self.outcome == FAIL:
            return "slower than the baseline: " + "; ".join(j.why for j in self.failures if j.why)
        if self.outcome == INCONCLUSIVE:
            return f"speed not proven (inconclusive, counted as a failure): {self.reason}"
        if self.new is not None:
            return compared_line(self.new, self.baseline)
        return self.reason

    def to_json(self) -> dict:
        return {"outcome": self.outcome, "ok": self.ok, "reason": self.reason, "line": self.line(),
                "samples": list(self.samples), "needed": self.needed,
                "judgements": [j.to_json() for j in self.judgements],
                "baseline": self.baseline.to_json() if self.baseline else None,
                "new": self.new.to_json() if self.new else None}


def samples(windows: Sequence[ServedFigures | Unavailable]) -> list[ServedFigures]:
    """The windows that are samples: figures, with traffic."""
    return [w for w in windows if isinstance(w, ServedFigures) and not w.idle]


def pooled_sd(a: Sequence[float], b: Sequence[float]) -> float:
    """The noise of one window, from every window of both sides: each value's deviation from
    its own side's median, clipped at 3 robust deviations (1.4826 x their median absolute
    deviation: a burst counts, but as no more than a large normal deviation), then their
    root mean square. One estimate from all the windows: a side's own, from a dozen
    windows, is itself too noisy, and the median absolute deviation alone wastes most of
    what normal noise tells (it would let the noise look small by chance too often)."""
    ma, mb = statistics.median(a), statistics.median(b)
    deviations = [v - ma for v in a] + [v - mb for v in b]
    clip = 3 * MAD_TO_SD * statistics.median(abs(d) for d in deviations)
    if clip == 0:
        return 0.0
    clipped = [max(-clip, min(clip, d)) for d in deviations]
    return math.sqrt(sum(d * d for d in clipped) / max(1, len(clipped) - 2))


def resolution_se(figure: str, base: Sequence[ServedFigures], new: Sequence[ServedFigures]) -> float:
    """The floor on the standard error of a histogram figure's difference: the resolution of
    the histograms it was read from (0 for a figure not read from one).

    A p99 read from a histogram is interpolated inside the bucket it lies in, as if that
    bucket's observations spread evenly; the true p99 can be anywhere in the bucket, so a
    window's p99 carries an error of up to the bucket's width ``w``: uniform, standard
    deviation w / sqrt(12). That error does not average away over windows (windows whose
    counts land the same way interpolate to the same value: the windows' own spread can be
    0), so it is a floor that does not shrink with the number of windows: per side the
    median bucket width of its windows, the two sides' errors combined,
    sqrt((w_b^2 + w_n^2) / 12). With the default margin 3.5, a p99 that moves by one bucket
    of an even histogram (a difference of w against a floor of 0.41 w) is not proven."""
    field = BUCKET.get(figure)
    if field is None:
        return 0.0
    widths = []
    for side in (base, new):
        w = [getattr(x, field) for x in side if getattr(x, field, None) is not None]
        widths.append(statistics.median(w) if w else 0.0)
    return math.sqrt((widths[0] ** 2 + widths[1] ** 2) / 12)


def summary(windows: Sequence[ServedFigures]) -> ServedFigures | None:
    """One ServedFigures of the medians of every numeric figure (what the lines show)."""
    if not windows:
        return None
    first = windows[0]
    medians = {}
    for f in fields(ServedFigures):
        if f.name in ("window_s", "release", "taken_at", "algorithm", "budget", "topk", "verify_width"):
            continue
        values = [getattr(w, f.name) for w in windows if getattr(w, f.name) is not None]
        medians[f.name] = (statistics.median(values) if values else None) if f.name not in ("requests", "aborted") \
            else sum(values)
    return replace(first, window_s=sum(w.window_s for w in windows), taken_at=windows[-1].taken_at, **medians)


def _fmt(figure: str, x: float) -> str:
    if figure == "error_rate":
        return f"{x * 100:.2f}%"
    return (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.2f}" if abs(x) < 10 else f"{x:.1f}") + UNITS[figure]


def judge(figure: str, threshold: Threshold, base: Sequence[ServedFigures], new: Sequence[ServedFigures],
          settings: AnalysisSettings) -> Judgement:
    b = [getattr(w, figure) for w in base if getattr(w, figure) is not None]
    n = [getattr(w, figure) for w in new if getattr(w, figure) is not None]
    name, need = NAMES[figure], settings.min_samples
    j = Judgement(figure, threshold.describe(), samples=(len(b), len(n)))
    if len(n) < need or (threshold.relative_pct is not None and threshold.absolute is None and len(b) < need):
        return replace(j, why=f"{name}: measured in {len(b)} baseline and {len(n)} new windows, fewer than the "
                              f"{need} needed: not judged")
    med_n = statistics.median(n)
    med_b = statistics.median(b) if len(b) >= need else None
    higher = threshold.higher_is_better
    fails = []
    worse = noise = None
    if med_b is not None and med_b != 0:
        worse = ((med_b - med_n) if higher else (med_n - med_b)) / abs(med_b) * 100
        se = max(MEDIAN_SE * pooled_sd(b, n) * math.sqrt(1 / len(b) + 1 / len(n)),
                 resolution_se(figure, base, new))
        noise = se / abs(med_b) * 100
        if threshold.relative_pct is not None and worse > threshold.relative_pct and worse > settings.margin * noise:
            direction = "below" if higher else "above"
            fails.append(f"{name} {_fmt(figure, med_n)} is {worse:.1f}% {direction} the baseline's "
                         f"{_fmt(figure, med_b)} (limit {'-' if higher else '+'}{threshold.relative_pct:g}%, "
                         f"noise {noise:.1f}%)")
    if threshold.absolute is not None:
        past = med_n < threshold.absolute if higher else med_n > threshold.absolute
        if past:
            was = f", the baseline's {_fmt(figure, med_b)}" if med_b is not None else ""
            fails.append(f"{name} {_fmt(figure, med_n)} is {'below' if higher else 'above'} the limit "
                         f"{_fmt(figure, threshold.absolute)}{was}")
    return replace(j, baseline=med_b, new=med_n, worse_pct=worse, noise_pct=noise, judged=True,
                   failed=bool(fails), why="; ".join(fails) or None)


def analyse(baseline: Sequence[ServedFigures | Unavailable], new: Sequence[ServedFigures | Unavailable],
            settings: AnalysisSettings) -> Verdict:
    """The baseline's windows against the new build's: pass, fail or inconclusive."""
    base, fresh = samples(baseline), samples(new)
    need = settings.min_samples
    counts = (len(base), len(fresh))
    medians = {"baseline": summary(base), "new": summary(fresh)}
    if len(base) < need or len(fresh) < need:
        short = [f"the {side} had {k} window{'s' if k != 1 else ''} with traffic" for side, k in
                 (("baseline", len(base)), ("new server", len(fresh))) if k < need]
        return Verdict(INCONCLUSIVE, f"{' and '.join(short)}, fewer than the {need} needed (an idle window is no "
                                     "sample: drive the server with [analysis.load])",
                       samples=counts, needed=need, baseline=medians["baseline"], new=medians["new"])
    judgements = tuple(judge(f, t, base, fresh, settings) for f in FIGURES
                       if (t := settings.threshold(f)) is not None)
    judged = [j for j in judgements if j.judged]
    if any(j.failed for j in judged):
        outcome, reason = FAIL, "; ".join(j.why for j in judged if j.failed and j.why)
    elif not judged:
        outcome, reason = INCONCLUSIVE, "no figure could be judged: " + "; ".join(j.why or "" for j in judgements)
    else:
        outcome = PASS
        reason = f"{len(judged)} figure{'s' if len(judged) != 1 else ''} within {'their' if len(judged) != 1 else 'its'}" \
                 f" limits over {counts[0]} + {counts[1]} windows"
    return Verdict(outcome, reason, judgements=judgements, samples=counts, needed=need, baseline=medians["baseline"],
                   new=medians["new"])


__all__ = ["FAIL", "INCONCLUSIVE", "PASS", "Judgement", "Verdict", "analyse", "judge", "pooled_sd", "resolution_se",
           "samples", "summary"]
