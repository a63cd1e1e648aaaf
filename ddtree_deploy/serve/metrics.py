"""The served figures from the serve program's scrapes: the request it is sent, and the
parse of its answer into ``ServedFigures`` (serve/figures.py). Pure: the Prometheus text is
read with ``prometheus_client``'s own text parser (the exposition format SGLang writes with
that same library), never a parser of ours; the names come from the release's pinned row
(release/metric_names.py), never from a literal here.

One window is two scrapes ``window_s`` apart:

- gauges (accept length, accept rate, draft tokens, ``gen_throughput`` as output tokens/s,
  running and queued requests): the mean of the two scrapes' values;
- histograms (ITL, TTFT): the p50 and p99 of the observations made between the two
  scrapes, from the bucket deltas, interpolated linearly inside the bucket as Prometheus's
  ``histogram_quantile`` does (an observation past the last finite bound counts as that
  bound); no observation in the window: None;
- counters: finished requests / s over the window, and the aborted share
  ``aborted / (finished + aborted)``.

SGLang labels its metrics (model, engine type, ranks, priority, streaming): the values of
one name are added up over its label sets (data-parallel ranks, priorities, streaming or
not each hold a share), except that label sets of a tensor- or pipeline-parallel rank other
than 0 are left out (those ranks repeat rank 0's scheduler figures); the accept length and
rate are averaged over their label sets instead (a mean is not a sum), and the draft
tokens' largest value is kept. A counter that went down between the two scrapes means the
server restarted in between: that window has no figures (``Unavailable``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ddtree_deploy.release.metric_names import COUNTER, MetricNames, sample_name
from ddtree_deploy.serve.figures import ENABLE_FLAG, ServedFigures, Unavailable

SCRAPE_TIMEOUT_S = 10.0  # one GET of /metrics or /server_info on the host, at most
DEFAULT_WINDOW_S = 10.0  # status's window: two scrapes this far apart
_OTHER_RANKS = ("tp_rank", "pp_rank", "attn_tp_rank")
_MEANS = ("accept_length", "accept_rate")


def wanted(names: MetricNames) -> list[str]:
    """The metric names the host keeps lines of (hostprog/metrics.py ``keep_lines``)."""
    return sorted({name for name, _ in names.kinds().values()})


def scrape_request(python: str, url: str, names: MetricNames, *, interval_s: float = DEFAULT_WINDOW_S,
                   scrapes: int = 2, timeout_s: float = SCRAPE_TIMEOUT_S) -> dict:
    """The serve program's ``metrics`` request: ``scrapes`` scrapes ``interval_s`` apart."""
    return {"op": "metrics", "python": python, "url": url, "interval_s": float(interval_s),
            "scrapes": int(scrapes), "timeout_s": float(timeout_s), "names": wanted(names)}


def scrape_deadline(request: Mapping[str, Any], slack_s: float = 30.0) -> float:
    """Seconds the controller waits for the answer to ``request``, at most: the scrapes'
    spacing, each GET's timeout (the /server_info read too: two endpoints) and a slack; under
    the load step (``request["load"]``) also its benchmark's start and stop."""
    n = int(request.get("scrapes", 2))
    load = request.get("load") or {}  # the load step: its benchmark's start, and its stop (TERM, then KILL)
    extra = (float(load.get("ready_timeout_s", 0)) + float(load.get("settle_s", 0)) + float(load.get("term_grace_s", 0))
             + 10.0) if load else 0.0
    return (n - 1) * float(request.get("interval_s", DEFAULT_WINDOW_S)) \
        + (n + 2) * float(request.get("timeout_s", SCRAPE_TIMEOUT_S)) + slack_s + extra


# ----------------------------------------------------------------------------- parsing


@dataclass(frozen=True)
class Scrape:
    """One scrape's samples: sample name -> ((labels, value), ...), and when (host clock)."""

    t: float
    mono: float
    samples: Mapping[str, tuple[tuple[Mapping[str, str], float], ...]]


class BadText(ValueError):
    """The text is not Prometheus's exposition format."""


def parse_text(text: str, *, t: float = 0.0, mono: float = 0.0) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    samples: dict[str, list] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    except (ValueError, TypeError, IndexError) as exc:  # what the parser raises on a bad line
        raise BadText(str(exc)[:200]) from None
    return Scrape(t=t, mono=mono, samples={k: tuple(v) for k, v in samples.items()})


def _counted(labels: Mapping[str, str]) -> bool:
    return all(labels.get(rank, "0") == "0" for rank in _OTHER_RANKS)


def _values(scrape: Scrape, name: str) -> list[float]:
    return [v for labels, v in scrape.samples.get(name, ()) if _counted(labels) and not math.isnan(v)]


def gauge(scrape: Scrape, name: str, how: str = "sum") -> float | None:
    values = _values(scrape, name)
    if not values:
        return None
    if how == "mean":
        return sum(values) / len(values)
    if how == "max":
        return max(values)
    return sum(values)


def counter(scrape: Scrape, name: str) -> float | None:
    values = _values(scrape, name)
    return sum(values) if values else None


def buckets(scrape: Scrape, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, added over its label sets."""
    out: dict[float, float] = {}
    for labels, value in scrape.samples.get(name + "_bucket", ()):
        if not _counted(labels) or "le" not in labels:
            continue
        bound = float(labels["le"])  # "+Inf" reads as inf
        out[bound] = out.get(bound, 0.0) + value
    return out


def quantile_in_bucket(before: Mapping[float, float], after: Mapping[float, float], q: float,
                       ) -> tuple[float, float] | None:
    """The q-quantile of the observations between two cumulative bucket snapshots, and the
    width of the bucket it lies in: the interpolation inside a bucket assumes its
    observations spread evenly, so the quantile is only known to within that width (the
    speed gate's noise floor for a histogram figure, serve/analysis.py)."""
    bounds = sorted(after)
    delta = [(b, after[b] - before.get(b, 0.0)) for b in bounds]
    if not delta or any(d < 0 for _, d in delta):
        return None
    total = delta[-1][1]
    if total <= 0:
        return None
    rank = q * total
    lower, below, previous = 0.0, 0.0, 0.0
    for bound, cumulative in delta:
        if cumulative >= rank:
            if math.isinf(bound):
                # Past the last finite bound: that bound, as histogram_quantile does; known to
                # no better than the last finite bucket's width.
                return lower, lower - previous
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0), bound - lower
        previous, lower, below = lower, bound, cumulative
    return lower, lower - previous


def quantile(before: Mapping[float, float], after: Mapping[float, float], q: float) -> float | None:
    """The q-quantile of the observations between two cumulative bucket snapshots."""
    found = quantile_in_bucket(before, after, q)
    return None if found is None else found[0]


def _mean(a: float | None, b: float | None) -> float | None:
    present = [x for x in (a, b) if x is not None]
    return sum(present) / len(present) if present else None


def _ms(x: float | None) -> float | None:
    return None if x is None else x * 1000.0


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def figures(first: Scrape, second: Scrape, names: MetricNames, info: Mapping[str, Any] | None,
            ) -> ServedFigures | Unavailable:
    """One window's figures from two scrapes (and /server_info's keys, when read)."""
    window = second.mono - first.mono
    if window <= 0:
        return Unavailable("the two scrapes were taken at the same time")
    counts = {}
    for field in ("requests", "aborted"):
        name = sample_name(getattr(names, field), COUNTER)
        # A labelled counter has no sample before its first increment: absent counts as 0.
        a, b = counter(first, name) or 0.0, counter(second, name) or 0.0
        if b < a:
            return Unavailable(f"the server restarted during the window ({name} went from {a:g} to {b:g})")
        counts[field] = int(round(b - a))
    hist = {}
    for field in ("itl", "ttft"):
        name = getattr(names, field)
        b0, b1 = buckets(first, name), buckets(second, name)
        p99 = quantile_in_bucket(b0, b1, 0.99)
        hist[field] = (_ms(quantile(b0, b1, 0.5)), _ms(p99[0] if p99 else None), _ms(p99[1] if p99 else None))

    def g(field: str) -> float | None:
        name = getattr(names, field)
        if name is None:
            return None
        how = "mean" if field in _MEANS else "max" if field == "num_draft_tokens" else "sum"
        return _mean(gauge(first, name, how), gauge(second, name, how))

    info = info or {}
    state = (info.get("internal_states") or [{}])[0] or {}
    finished, aborted = counts["requests"], counts["aborted"]
    width = _int_or_none(state.get("ddtree_verify_width")) or _int_or_none(info.get("speculative_num_draft_tokens"))
    avg = state.get("avg_spec_accept_length")
    return ServedFigures(
        window_s=round(window, 3), release=names.release, taken_at=_iso(second.t) if second.t else None,
        algorithm=info.get("speculative_algorithm"), budget=_int_or_none(info.get("speculative_ddtree_budget")),
        topk=_int_or_none(info.get("speculative_ddtree_topk")), verify_width=width,
        avg_accept_length=float(avg) if isinstance(avg, (int, float)) and not isinstance(avg, bool) else None,
        accept_length=g("accept_length"), accept_rate=g("accept_rate"), num_draft_tokens=g("num_draft_tokens"),
        output_tps=g("gen_throughput"), running=g("running_reqs"), queue=g("queue_reqs"),
        itl_p50_ms=hist["itl"][0], itl_p99_ms=hist["itl"][1], ttft_p50_ms=hist["ttft"][0],
        ttft_p99_ms=hist["ttft"][1], itl_p99_bucket_ms=hist["itl"][2], ttft_p99_bucket_ms=hist["ttft"][2],
        requests=finished, aborted=aborted,
        request_rate=finished / window,
        error_rate=aborted / (finished + aborted) if finished + aborted else None,
    )


def windows(answer: Mapping[str, Any], names: MetricNames) -> list[ServedFigures | Unavailable]:
    """Every window of a ``metrics`` answer (N scrapes: N - 1 windows, in order), or one
    ``Unavailable`` saying why there is none (no /metrics: names the flag that enables it)."""
    state = answer.get("metrics")
    if state == "missing":
        return [Unavailable(f"{answer.get('url')}/metrics answered 404: the server runs without {ENABLE_FLAG}",
                            hint=f"add {ENABLE_FLAG} to the server's launch command to see its figures")]
    scrapes = [s for s in answer.get("scrapes") or () if s.get("text") is not None]
    out: list[ServedFigures | Unavailable] = []
    parsed = []
    for s in scrapes:
        try:
            parsed.append(parse_text(s["text"], t=float(s.get("t") or 0.0), mono=float(s.get("mono") or 0.0)))
        except BadText as exc:
            return [Unavailable(f"{answer.get('url')}/metrics: not Prometheus text ({exc})")]
    for a, b in zip(parsed, parsed[1:]):
        out.append(figures(a, b, names, answer.get("server_info")))
    if state != "ok":
        out.append(Unavailable(str(answer.get("detail") or f"the scrapes stopped ({state})")))
    elif not out:
        out.append(Unavailable("fewer than two scrapes: no window to measure"))
    return out


def window(answer: Mapping[str, Any], names: MetricNames) -> ServedFigures | Unavailable:
    """The one window of a two-scrape answer (status's live line)."""
    return windows(answer, names)[0]


def served_only(results: Sequence[ServedFigures | Unavailable]) -> list[ServedFigures]:
    return [r for r in results if isinstance(r, ServedFigures)]


__all__ = ["BadText", "DEFAULT_WINDOW_S", "SCRAPE_TIMEOUT_S", "Scrape", "buckets", "counter", "figures", "gauge",
           "parse_text", "quantile", "quantile_in_bucket", "scrape_deadline", "scrape_request", "served_only", "wanted",
           "window", "windows"]
