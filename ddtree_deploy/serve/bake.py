"""The speed gate's two measurements around a switch, and what they decide (issue 29 §2).

- ``measure_baseline``: the OLD server, sampled on the same host just before the switch (the
  same traffic): ``settings.samples`` windows of ``interval_s``. When that server is idle (fewer
  windows with traffic than ``min_samples``), the last promoted deploy's windows from the host's
  history stand in (``recorded_baseline``), and say so.
- ``bake``: the NEW server, after its restart and DDTree proof, sampled the same way; the
  baseline against it through ``analysis.analyse`` -> a ``Bake`` (pass: promote; fail,
  inconclusive, or a server that stopped answering: roll back).

How a window is taken is the caller's (``Sampler``: the serve program's ``metrics`` op over
the host's transport, ``metrics_run.sample_windows``), so this module holds the decisions and
the records, not the connection. Under the load step (``[analysis.load]``, serve/loadstep.py)
the caller's sampler drives the server too: the baseline keeps the load's record (``load``),
the bake is driven exactly when its baseline was, and their lines say so. A Ctrl-C under a sample raises out of the sampler
(``inflight``): nothing here catches it.

The history keeps a ``speed`` entry per stage (``record``): the baseline as soon as it is
sampled (so a rerun after Ctrl-C judges against it), and the verdict with the figures before
and after (the medians) and, when promoted, the new windows (the next push's baseline when its
old server is idle).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ddtree_deploy.base.progress import Progress, quiet
from ddtree_deploy.serve import analysis, loadstep
from ddtree_deploy.serve.figures import (
    ENABLE_FLAG,
    ServedFigures,
    Unavailable,
    compared_line,
    figures_from_json,
    figures_line,
)
from ddtree_deploy.settings.analysis import AnalysisSettings

Window = ServedFigures | Unavailable
Sampler = Callable[[float, int], Sequence[Window]]  # (interval_s, scrapes) -> scrapes - 1 windows

LIVE, RECORD, NONE = "live", "record", "none"  # where a baseline came from
PROMOTED, ROLLED_BACK = "promoted", "rolled back"
SKIPPED = "--no-analysis"


def sample(sampler: Sampler, settings: AnalysisSettings) -> list[Window]:
    """One side's windows: ``settings.samples`` of ``interval_s`` each."""
    return list(sampler(settings.interval_s, settings.samples + 1))


def without_metrics(windows: Sequence[Window]) -> Unavailable | None:
    """The server answers, but exports no figures (no ``/metrics``: launched without
    ``--enable-metrics``): why, else None. A gate that cannot measure the old server cannot
    measure the new one launched the same way: the push is refused before its switch."""
    return next((w for w in windows if isinstance(w, Unavailable) and f"without {ENABLE_FLAG}" in w.why), None)


def stopped(windows: Sequence[Window]) -> Unavailable | None:
    """Why the scrapes stopped early (the server went away, or has no metrics), else None."""
    return next((w for w in windows if isinstance(w, Unavailable)), None)


@dataclass(frozen=True)
class Baseline:
    """What the new build is judged against."""

    windows: tuple[Window, ...]
    source: str  # live | record | none
    note: str  # one line: where it came from
    run_id: str | None = None  # record: the promoted push whose windows these are
    load: dict | None = None  # taken under the load step: its record (loadstep.Plan.record); the bake is too
    plan: loadstep.Plan | None = field(default=None, compare=False)  # that load, in this run (not recorded)

    @property
    def usable(self) -> bool:
        return self.source != NONE

    def medians(self) -> ServedFigures | None:
        return analysis.summary(analysis.samples(self.windows))

    def to_json(self) -> dict:
        return {"source": self.source, "note": self.note, "run_id": self.run_id, "load": self.load,
                "windows": [w.to_json() for w in self.windows]}

    @classmethod
    def from_json(cls, doc: dict) -> "Baseline":
        load = doc.get("load")
        return cls(tuple(figures_from_json(w) for w in doc.get("windows") or () if isinstance(w, dict)),
                   str(doc.get("source") or RECORD), str(doc.get("note") or ""), doc.get("run_id"),
                   load if isinstance(load, dict) else None)


def recorded_baseline(entries: Iterable[dict]) -> Baseline | None:
    """The newest promoted deploy's windows in the host's history (entries newest first), or None."""
    for e in entries:
        speed = e.get("speed") if e.get("event") == "speed" else None
        if isinstance(speed, dict) and speed.get("stage") == "verdict" and speed.get("outcome") == PROMOTED \
                and speed.get("windows"):
            windows = tuple(figures_from_json(w) for w in speed["windows"] if isinstance(w, dict))
            load = speed.get("load") if isinstance(speed.get("load"), dict) else None
            return Baseline(windows, RECORD, f"the old server had no traffic: the baseline is push run "
                            f"{e.get('run_id') or '?'}'s bake of {e.get('time') or '?'}{loadstep.said(load)}",
                            e.get("run_id"), load)
    return None


def pending_baseline(entries: Iterable[dict], run_id: str | None) -> Baseline | None:
    """The baseline a run recorded before its switch (a rerun after Ctrl-C judges against it)."""
    for e in entries:
        speed = e.get("speed") if e.get("event") == "speed" else None
        if isinstance(speed, dict) and speed.get("stage") == "baseline" and speed.get("push_run") == run_id \
                and isinstance(speed.get("baseline"), dict):
            found = Baseline.from_json(speed["baseline"])
            return Baseline(found.windows, found.source, f"{found.note} (sampled by this run before its switch)",
                            found.run_id, found.load)
    return None


def measure_baseline(sampler: Sampler, settings: AnalysisSettings, *, recorded: Baseline | None = None,
                     progress: Progress = quiet, load: loadstep.Plan | None = None,
                     not_driven: str | None = None) -> Baseline:
    """The old server's windows; where it has too little traffic, ``recorded`` (the last
    promoted deploy's) instead; neither: a baseline of ``NONE`` (the bake is inconclusive).
    ``load``: ``sampler`` drives the server with the load step (the bake will too: recorded
    with the baseline); ``not_driven``: why a load step the table has is not run (said)."""
    under = loadstep.said(load.record()) if load is not None else ""
    progress(f"speed baseline: {settings.samples} windows of {settings.interval_s:g} s on the old server{under}"
             + (" (after one of warm-up)" if load is not None else ""))
    if load is None:
        windows = tuple(sample(sampler, settings))
    else:  # a load that just started: its first window is its ramp, dropped as the bake drops its first
        windows = tuple(sampler(settings.interval_s, settings.samples + 2))[1:]
    busy = len(analysis.samples(windows))
    if busy >= settings.min_samples:
        note = f"the old server, {busy} windows of {settings.interval_s:g} s just before the switch{under}"
        if not_driven:
            note += f" ({not_driven})"
        return Baseline(windows, LIVE, note, load=load.record() if load is not None else None, plan=load)
    if recorded is not None:
        return recorded
    why = stopped(windows)
    said = f"the old server had {busy} window{'s' if busy != 1 else ''} with traffic"
    if why is not None:
        said += f" ({why.line})"
    return Baseline(windows, NONE, f"{said} and the history holds no promoted deploy's figures")


@dataclass(frozen=True)
class Bake:
    """The new server's bake against the baseline: whether the push is promoted."""

    baseline: Baseline | None
    windows: tuple[Window, ...] = ()
    verdict: analysis.Verdict | None = None
    skipped: str | None = None  # --no-analysis: not judged (said in the outcome)
    died: str | None = field(default=None)  # the server stopped answering during the bake
    load_failed: str | None = None  # the load step could not drive the new server as it drove the old

    @property
    def load(self) -> dict | None:
        """The load step's record when the figures were taken under it (both sides were)."""
        return self.baseline.load if self.baseline is not None else None

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (self.died is None and self.load_failed is None
                                            and self.verdict is not None and self.verdict.ok)

    @property
    def outcome(self) -> str:
        if self.skipped is not None:
            return "skipped"
        return PROMOTED if self.ok else ROLLED_BACK

    @property
    def cause(self) -> str:
        """What failed, in the journal's ``automatic`` record's ``step``."""
        if self.died is not None:
            return "server died"
        if self.load_failed is not None:
            return "load step failed"
        return self.verdict.outcome if self.verdict is not None else "no verdict"

    def why(self) -> str:
        """The failure in one clause: which figure, by how much, and the baseline."""
        if self.died is not None:
            return f"the server stopped answering during the bake: {self.died}"
        if self.load_failed is not None:
            return f"not judged: the load step failed during the bake: {self.load_failed}"
        text = self.verdict.line() if self.verdict is not None else "no verdict"
        if self.baseline is not None and self.baseline.source == NONE:
            text += f" ({self.baseline.note})"
        return text + loadstep.said(self.load)

    def line(self) -> str:
        """The outcome line's speed part."""
        if self.skipped is not None:
            return f"speed analysis skipped ({self.skipped})"
        if not self.ok:
            return self.why()
        v = self.verdict
        base = self.baseline
        said = compared_line(v.new, v.baseline) if v is not None and v.new is not None else v.reason
        if base is not None and base.source == RECORD:
            said += f" (baseline: push run {base.run_id or '?'}'s bake)"
        return f"serving {said}{loadstep.said(self.load)}: {PROMOTED}"

    def record(self) -> dict:
        """The history's ``speed`` entry (the verdict stage): before/after, and the windows kept
        as the next push's baseline when promoted."""
        v = self.verdict
        doc = {"stage": "verdict", "outcome": self.outcome, "line": self.line(),
               "baseline_source": self.baseline.source if self.baseline else None,
               "before": v.baseline.to_json() if v is not None and v.baseline is not None else None,
               "after": v.new.to_json() if v is not None and v.new is not None else None,
               "verdict": v.outcome if v is not None else None, "died": self.died, "load": self.load,
               "load_failed": self.load_failed}
        if self.ok and self.skipped is None:
            doc["windows"] = [w.to_json() for w in self.windows]
        return doc

    def to_json(self) -> dict:
        return {"outcome": self.outcome, "ok": self.ok, "line": self.line(), "skipped": self.skipped,
                "died": self.died, "load_failed": self.load_failed, "load": self.load,
                "baseline": self.baseline.to_json() if self.baseline else None,
                "verdict": self.verdict.to_json() if self.verdict else None,
                "windows": len(self.windows)}


def bake(sampler: Sampler, settings: AnalysisSettings, baseline: Baseline, *, progress: Progress = quiet) -> Bake:
    """The new server's windows, judged against ``baseline`` (see the module doc). One more
    window than the baseline's is taken and the first is dropped: a server restarted a moment
    ago averages its gauges from zero there (the stand-in's first window reads half its accept
    length), which is the restart, not the build."""
    progress(f"speed analysis: the new server bakes {settings.samples} windows of {settings.interval_s:g} s "
             f"(after one of warm-up){loadstep.said(baseline.load)}")
    taken = tuple(sampler(settings.interval_s, settings.samples + 2))
    gone = stopped(taken)
    windows = taken[1:]
    verdict = analysis.analyse(baseline.windows, windows, settings)
    return Bake(baseline, windows, verdict, died=gone.line if gone is not None else None)


def skipped(why: str = SKIPPED) -> Bake:
    return Bake(None, skipped=why)


# ---------------------------------------------------------------- before/after of a restart or rollback


def around_record(before: Window | None, after: Window | None) -> dict:
    """The history's ``speed`` entry of a restart or a rollback: one short window each side."""
    return {"stage": "around", "before": before.to_json() if before is not None else None,
            "after": after.to_json() if after is not None else None,
            "line": compared_line(after, before) if after is not None else None}


def entry_words(speed: dict) -> str:
    """A history ``speed`` entry in words (``history``'s line)."""
    stage = speed.get("stage")
    if stage == "baseline":
        base = Baseline.from_json(speed.get("baseline") or {})
        medians = base.medians()
        return (f"baseline ({base.source}): " + (figures_line(medians) if medians is not None else base.note)
                + loadstep.said(base.load))
    before = figures_from_json(speed["before"]) if isinstance(speed.get("before"), dict) else None
    after = figures_from_json(speed["after"]) if isinstance(speed.get("after"), dict) else None
    if stage == "verdict":
        return str(speed.get("line") or speed.get("outcome") or "?")
    if after is None:
        return "no figures after"
    return "after: " + compared_line(after, before)


def speed_cell(doc: dict | None) -> str:
    """A host's speed analysis (``Bake.to_json``) in a fleet's outcome table: its baseline and
    new figures (the medians) and how it ended; "" when none ran."""
    if not isinstance(doc, dict):
        return ""
    if doc.get("skipped"):
        return f"skipped ({doc['skipped']})"
    verdict = doc.get("verdict") or {}
    base, new = verdict.get("baseline") or {}, verdict.get("new") or {}
    parts = []
    for key, label, unit, fmt in (("output_tps", "", " tok/s", "{:,.0f}"), ("accept_length", "accept ", "", "{:.1f}"),
                                  ("itl_p99_ms", "p99 ITL ", " ms", "{:,.0f}")):
        b, n = base.get(key), new.get(key)
        if b is None and n is None:
            continue
        was = fmt.format(b) if b is not None else "?"
        now = fmt.format(n) if n is not None else "?"
        change = f" ({(n / b - 1) * 100:+.1f}%)" if key == "output_tps" and b and n is not None else ""
        parts.append(f"{label}{was} -> {now}{unit}{change}")
    said = ", ".join(parts) or (doc.get("died") or "no figures")
    return f"{said}: {doc.get('outcome')}"


__all__ = ["Bake", "Baseline", "LIVE", "NONE", "PROMOTED", "RECORD", "ROLLED_BACK", "SKIPPED", "Sampler",
           "around_record", "bake", "entry_words", "measure_baseline", "pending_baseline", "recorded_baseline",
           "sample", "skipped", "speed_cell", "stopped", "without_metrics"]
