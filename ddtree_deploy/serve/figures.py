"""The served figures: what a serving SGLang did over one window, as one typed value, its JSON
form and its one-line renderings. Pure.

``ServedFigures`` is one window: two scrapes of ``/metrics`` ``window_s`` apart (the
gauges averaged over the two, the counters and histograms as the deltas between them),
plus what ``/server_info`` says (algorithm, widths, the server's own mean accept length).
``serve/metrics.py`` builds it from the serve program's scrapes; ``Unavailable`` says why
there is none (no ``/metrics``: the server runs without ``--enable-metrics``). A figure the
window cannot give is None (no finished request: no latency percentile), never 0.

The JSON form (docs/json.md, "Served figures"; ``$defs.served_figures`` in
docs/json-schema.json) is ``to_json``'s, read back by ``from_json``.

Two renderings, one function each, used wherever a line is printed:

    figures_line(f)        DDTree B=64/K=8: accept length 3.4, 1,210 tok/s at 31 running,
                           p99 ITL 41 ms, 2.1 req/s (window 10 s)
    compared_line(f, was)  DDTree B=64/K=8: accept length 3.4 (was 2.9), 1,210 tok/s (was
                           1,020, +18.6%) at 31 running, p99 ITL 41 ms (was 44), 2.1 req/s
                           (window 10 s)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

ENABLE_FLAG = "--enable-metrics"


@dataclass(frozen=True)
class ServedFigures:
    """One window of a serving server's figures (None: the window cannot say)."""

    window_s: float  # seconds between the two scrapes
    release: str  # the release whose pinned metric names were read (release/metric_names.py)
    taken_at: str | None = None  # ISO time of the window's second scrape (the host's clock)
    # /server_info
    algorithm: str | None = None  # speculative_algorithm: "DDTREE", "DFLASH", ... or None
    budget: int | None = None  # speculative_ddtree_budget
    topk: int | None = None  # speculative_ddtree_topk
    verify_width: int | None = None  # ddtree_verify_width (the DDTree report), else the draft tokens
    avg_accept_length: float | None = None  # internal_states[0].avg_spec_accept_length (since start)
    # /metrics gauges: the mean of the two scrapes
    accept_length: float | None = None
    accept_rate: float | None = None
    num_draft_tokens: float | None = None
    output_tps: float | None = None  # sglang:gen_throughput, the scheduler's decode tokens/s
    running: float | None = None
    queue: float | None = None
    # /metrics histograms: percentiles of the observations made in the window
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    # the width of the bucket each p99 lies in: the p99 is known to within it (the speed
    # gate's noise floor for these figures, serve/analysis.py); None: not from a histogram
    itl_p99_bucket_ms: float | None = None
    ttft_p99_bucket_ms: float | None = None
    # /metrics counters: deltas over the window
    requests: int = 0  # finished in the window
    aborted: int = 0  # aborted in the window
    request_rate: float | None = None  # finished requests / s
    error_rate: float | None = None  # aborted / (finished + aborted); None: none of either

    @property
    def idle(self) -> bool:
        """No request finished, none aborted, none running: the window measured no traffic."""
        return self.requests == 0 and self.aborted == 0 and not self.running

    def to_json(self) -> dict:
        return {"available": True, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "ServedFigures":
        return cls(**{f.name: doc.get(f.name) for f in fields(cls) if f.name in doc})


@dataclass(frozen=True)
class Unavailable:
    """Why a server gave no figures: one line, and what to do."""

    why: str
    hint: str | None = None

    @property
    def line(self) -> str:
        return self.why + (f"; {self.hint}" if self.hint else "")

    def to_json(self) -> dict:
        return {"available": False, "why": self.why, "hint": self.hint}


def figures_from_json(doc: Mapping[str, Any]) -> ServedFigures | Unavailable:
    if doc.get("available") is False:
        return Unavailable(why=str(doc.get("why")), hint=doc.get("hint"))
    return ServedFigures.from_json(doc)


# ----------------------------------------------------------------------------- rendering


def label(f: ServedFigures) -> str:
    """What the server runs: ``DDTree B=64/K=8``, ``DFlash chain``, ``no speculation``."""
    algo = (f.algorithm or "").upper()
    if algo == "DDTREE":
        widths = "/".join(part for part in (f"B={f.budget}" if f.budget is not None else "",
                                             f"K={f.topk}" if f.topk is not None else "") if part)
        return "DDTree" + (f" {widths}" if widths else "")
    if algo == "DFLASH":
        return "DFlash chain"
    if not algo or algo == "NONE":
        return "no speculation"
    return algo


def _n(x: float, digits: int = 1) -> str:
    """1210.4 -> '1,210'; 3.41 -> '3.4'; 0.042 -> '0.042'."""
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 1 or x == 0:
        return f"{x:,.{digits}f}"
    return f"{x:.2g}"


def _change(new: float, old: float) -> str:
    return f"{(new / old - 1) * 100:+.1f}%" if old else ""


def _parts(f: ServedFigures, was: ServedFigures | None) -> list[str]:
    def was_(value, old, *, pct: bool = False, digits: int = 1) -> str:
        if was is None or old is None or value is None:
            return ""
        change = _change(value, old) if pct else ""
        return f" (was {_n(old, digits)}{', ' + change if change else ''})"

    parts = []
    if f.accept_length is not None:
        parts.append(f"accept length {_n(f.accept_length)}" + was_(f.accept_length, getattr(was, "accept_length", None)))
    if f.output_tps is not None:
        text = f"{_n(f.output_tps)} tok/s" + was_(f.output_tps, getattr(was, "output_tps", None), pct=True)
        if f.running is not None:
            text += f" at {_n(f.running, 0)} running"
        parts.append(text)
    if f.itl_p99_ms is not None:
        parts.append(f"p99 ITL {_n(f.itl_p99_ms, 0)} ms" + was_(f.itl_p99_ms, getattr(was, "itl_p99_ms", None), digits=0))
    if f.request_rate is not None:
        parts.append(f"{_n(f.request_rate)} req/s")
    if f.error_rate:
        parts.append(f"{f.error_rate * 100:.1f}% aborted")
    return parts


def figures_line(f: ServedFigures | Unavailable) -> str:
    """The one-line form of one window (or why there is none)."""
    if isinstance(f, Unavailable):
        return f.line
    if f.idle:
        return f"{label(f)}: idle (no request in the window of {f.window_s:.0f} s)"
    return f"{label(f)}: {', '.join(_parts(f, None)) or 'no figures'} (window {f.window_s:.0f} s)"


def compared_line(f: ServedFigures | Unavailable, was: ServedFigures | Unavailable | None) -> str:
    """The before/after form: each figure with the baseline's (``was``) beside it."""
    if isinstance(f, Unavailable) or not isinstance(was, ServedFigures):
        return figures_line(f)
    if f.idle:
        return figures_line(f)
    return f"{label(f)}: {', '.join(_parts(f, was)) or 'no figures'} (window {f.window_s:.0f} s)"


__all__ = ["ENABLE_FLAG", "ServedFigures", "Unavailable", "compared_line", "figures_from_json", "figures_line",
           "label"]
