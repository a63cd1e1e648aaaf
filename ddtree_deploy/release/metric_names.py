"""The Prometheus metric names the toolkit reads from a serving SGLang, pinned per release.

SGLang exports its figures on ``/metrics`` when launched with ``--enable-metrics``: the
gauges, counters and histograms of ``sglang/srt/observability/metrics_collector.py``
(``SchedulerMetricsCollector`` and ``TokenizerMetricsCollector``). The served-figures code
(``serve/metrics.py``) asks this table for a release's names and never writes one itself,
so a release that renames a metric changes one row here, and
``tests/integration/test_metric_names.py`` reads every pinned name, with its kind, from each covered
release's own wheel: a rename or a removal fails there, naming the release and the metric.

Every release from 0.5.12 to 0.5.23 was read (the wheels through the project's cache,
``release/releases.py``). The names are the same in all of them except one:
``sglang:spec_num_draft_tokens`` (the verify width the speculative worker runs at) first
appears in 0.5.13; 0.5.12 and 0.5.12.post1 have no such gauge (``None`` here).

A counter is pinned as SGLang declares it (``sglang:num_requests_total``); the Prometheus
client exposes its samples under that name (a declared name without ``_total`` gains it:
``sample_name``). A histogram's samples are ``<name>_bucket`` (with ``le``), ``_sum`` and
``_count``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from packaging.version import InvalidVersion, Version

from ddtree_deploy.base.errors import BadInput

GAUGE, COUNTER, HISTOGRAM = "gauge", "counter", "histogram"


@dataclass(frozen=True)
class MetricNames:
    """The names one release exports for what the toolkit reads (None: not in that release)."""

    release: str  # the release these names were read from
    accept_length: str  # gauge: mean accepted tokens per verify step, bonus token included
    accept_rate: str  # gauge: accepted drafts / proposed drafts
    num_draft_tokens: str | None  # gauge: the verify width the worker runs at (0.5.13+)
    gen_throughput: str  # gauge: the scheduler's decode throughput, tokens/s
    running_reqs: str  # gauge: requests decoding now
    queue_reqs: str  # gauge: requests waiting
    itl: str  # histogram: inter-token latency, seconds (per token)
    ttft: str  # histogram: time to first token, seconds
    e2e: str  # histogram: end-to-end request latency, seconds
    requests: str  # counter: finished requests (the request rate)
    aborted: str  # counter: aborted requests (the error rate)
    generation_tokens: str  # counter: output tokens of finished requests

    def kinds(self) -> dict[str, tuple[str, str]]:
        """field -> (metric name, kind), the fields this release has."""
        out = {}
        for f in fields(self):
            if f.name == "release":
                continue
            name = getattr(self, f.name)
            if name is not None:
                out[f.name] = (name, KIND[f.name])
        return out


#: The Prometheus kind of each field (what SGLang declares it as).
KIND = {
    "accept_length": GAUGE, "accept_rate": GAUGE, "num_draft_tokens": GAUGE, "gen_throughput": GAUGE,
    "running_reqs": GAUGE, "queue_reqs": GAUGE, "itl": HISTOGRAM, "ttft": HISTOGRAM, "e2e": HISTOGRAM,
    "requests": COUNTER, "aborted": COUNTER, "generation_tokens": COUNTER,
}

_V0_5_13 = MetricNames(
    release="0.5.13",
    accept_length="sglang:spec_accept_length",
    accept_rate="sglang:spec_accept_rate",
    num_draft_tokens="sglang:spec_num_draft_tokens",
    gen_throughput="sglang:gen_throughput",
    running_reqs="sglang:num_running_reqs",
    queue_reqs="sglang:num_queue_reqs",
    itl="sglang:inter_token_latency_seconds",
    ttft="sglang:time_to_first_token_seconds",
    e2e="sglang:e2e_request_latency_seconds",
    requests="sglang:num_requests_total",
    aborted="sglang:num_aborted_requests_total",
    generation_tokens="sglang:generation_tokens_total",
)

#: Every covered release, read from its wheel (tests/integration/test_metric_names.py holds them to it).
PINNED: dict[str, MetricNames] = {
    v: replace(_V0_5_13, release=v, num_draft_tokens=None) if v.startswith("0.5.12") else replace(_V0_5_13, release=v)
    for v in ("0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14", "0.5.15", "0.5.15.post1",
              "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
}


def _version(text: str) -> Version:
    try:
        return Version(str(text))
    except InvalidVersion:
        raise BadInput(f"{text!r} is not an SGLang version", hint="e.g. 0.5.23") from None


def names_for(version: str) -> MetricNames:
    """The names of ``version``: its own row, or, for a release newer than the table (or
    between two rows), the newest pinned release before it, whose ``release`` says which
    (the figures name it, so an unpinned release is never taken for a pinned one). A
    release older than every row is refused: its names were never read."""
    want = _version(version)
    older = [(Version(v), row) for v, row in PINNED.items() if Version(v) <= want]
    if not older:
        raise BadInput(f"sglang {version}: no metric names are pinned for a release before "
                       f"{min(PINNED, key=Version)}",
                       hint="the served figures read releases from 0.5.12 on")
    return max(older, key=lambda pair: pair[0])[1]


def sample_name(name: str, kind: str) -> str:
    """The name a metric's value sample carries on ``/metrics`` (a counter's ends ``_total``)."""
    if kind == COUNTER and not name.endswith("_total"):
        return name + "_total"
    return name


__all__ = ["COUNTER", "GAUGE", "HISTOGRAM", "KIND", "MetricNames", "PINNED", "names_for", "sample_name"]
