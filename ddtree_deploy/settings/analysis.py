"""The host's ``[analysis]`` table: how a new build's served speed is judged against the build
it replaces (serve/analysis.py), and the overrides a fleet file or the command line lays over
it. Pure: read through ``toml_input.TomlFile``, so a wrong value is the one message every TOML
input gives, ``<file>: line N: analysis.<key>: <what is wrong>; <what to do>``.

    [analysis]
    window_s = 180         # how long the new server bakes (and the baseline is sampled)
    interval_s = 10        # one sample: two scrapes this far apart; window_s / interval_s samples
    min_samples = 9        # fewer samples with traffic on either side: inconclusive (a failure)
    margin = 3.5           # a regression must also exceed this many standard errors of the noise

    [analysis.thresholds]  # relative to the baseline ("-5%", "+10%") or absolute (a number)
    accept_length = "-5%"  # at most 5% below the baseline; 2.5: at least 2.5 tokens per step
    output_tps = "-5%"     # output tokens/s; 800: at least 800
    itl_p99_ms = "+10%"    # p99 inter-token latency; 60: at most 60 ms
    ttft_p99_ms = "+25%"   # p99 time to first token; 2000: at most 2 s
    error_rate = 0.01      # aborted share of requests: at most 1%; "+N%": relative
    # a figure set to false is not judged; ["-5%", 800] sets both kinds

    [analysis.load]        # optional: drive the server when it has no live traffic
    prompts = "prompts/chat.jsonl"   # the operator's prompt file (this machine; tune's format)
    concurrency = 16
    output_len = 256
    when = "idle"          # "idle": only when the server has no traffic of its own; "always"
    # tokenizer = "/models/llama"  # on the host; default: the id the server's /v1/models gives

The defaults (every key above but ``[analysis.load]``) are the ones measured by the
analysis simulation (bench/analysis_bench.py, docs/analysis.md): with them, equal builds
are never rolled back on the stand-in's noise turned up, and a build 10% slower is caught.

``apply_overrides`` lays ``key=value`` overrides (``--analysis window_s=60``, a fleet
file's ``[analysis]``) over a host's table and checks the result with the same messages,
naming where the override came from.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.base.toml_input import Table, TomlFile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

HIGHER = ("accept_length", "output_tps")  # a drop is a regression
LOWER = ("itl_p99_ms", "ttft_p99_ms", "error_rate")  # a rise is a regression
FIGURES = HIGHER + LOWER
WHEN = ("idle", "always")
_KEYS = ("window_s", "interval_s", "min_samples", "margin", "thresholds", "load")
_LOAD_KEYS = ("prompts", "concurrency", "output_len", "when", "tokenizer")
_RELATIVE = re.compile(r"^\s*([+-]?)(\d+(?:\.\d+)?)\s*%\s*$")
_UNITS = {"accept_length": "tokens per step", "output_tps": "tokens/s", "itl_p99_ms": "ms", "ttft_p99_ms": "ms",
          "error_rate": "share of requests, 0 to 1"}


@dataclass(frozen=True)
class Threshold:
    """One figure's limits: ``relative_pct`` (how much worse than the baseline it may be, in
    percent) and ``absolute`` (a floor for accept length and tokens/s, a ceiling for the
    latencies and the error rate); either may be None."""

    figure: str
    relative_pct: float | None = None
    absolute: float | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.figure in HIGHER

    def describe(self) -> str:
        parts = []
        if self.relative_pct is not None:
            parts.append(f"{'-' if self.higher_is_better else '+'}{self.relative_pct:g}% of the baseline")
        if self.absolute is not None:
            parts.append(f"{'>=' if self.higher_is_better else '<='} {self.absolute:g}")
        return " and ".join(parts) or "not judged"


DEFAULT_THRESHOLDS = (
    Threshold("accept_length", relative_pct=5.0),
    Threshold("output_tps", relative_pct=5.0),
    Threshold("itl_p99_ms", relative_pct=10.0),
    Threshold("ttft_p99_ms", relative_pct=25.0),
    Threshold("error_rate", absolute=0.01),
)


@dataclass(frozen=True)
class LoadStep:
    """Drive the server with the operator's prompts (SGLang's benchmark, on the host)."""

    prompts: str  # a prompt file on this machine (tuning/prompts.py reads it)
    concurrency: int = 16
    output_len: int = 256
    when: str = "idle"
    tokenizer: str | None = None  # on the host; None: the benchmark loads the server's /v1/models id


@dataclass(frozen=True)
class AnalysisSettings:
    """``[analysis]``, validated (every default is the measured one)."""

    window_s: float = 180.0
    interval_s: float = 10.0
    min_samples: int = 9
    margin: float = 3.5
    thresholds: tuple[Threshold, ...] = DEFAULT_THRESHOLDS
    load: LoadStep | None = None
    source: str | None = field(default=None, compare=False)

    @property
    def samples(self) -> int:
        """Samples a side takes: one per interval of the window."""
        return int(self.window_s // self.interval_s)

    def threshold(self, figure: str) -> Threshold | None:
        found = next((t for t in self.thresholds if t.figure == figure), None)
        return found if found is not None and (found.relative_pct is not None or found.absolute is not None) else None

    def to_json(self) -> dict[str, Any]:
        return {"window_s": self.window_s, "interval_s": self.interval_s, "samples": self.samples,
                "min_samples": self.min_samples, "margin": self.margin,
                "thresholds": {t.figure: {"relative_pct": t.relative_pct, "absolute": t.absolute}
                               for t in self.thresholds},
                "load": None if self.load is None else {"prompts": self.load.prompts,
                                                        "concurrency": self.load.concurrency,
                                                        "output_len": self.load.output_len, "when": self.load.when,
                                                        "tokenizer": self.load.tokenizer}}


# ----------------------------------------------------------------------------- parsing


def _doc(given: Any, *, source: str | None) -> TomlFile:
    if isinstance(given, TomlFile):
        return given
    if isinstance(given, Table) and given.doc is not None and given.key == "analysis":
        return given.doc  # the host file it was read from: its lines
    return TomlFile.of({"analysis": dict(given)} if given else {}, source=source or "<inventory>")


def parse_analysis(table: Any, *, source: str | None) -> AnalysisSettings | None:
    """``[analysis]`` -> AnalysisSettings (None: no table), or one BadInput line naming the key.

    ``table``: ``host.analysis`` as the inventory keeps it (a ``toml_input.Table`` that
    remembers its file), a plain dict, or a ``TomlFile`` holding an ``analysis`` table."""
    doc = _doc(table, source=source)
    if doc.get("analysis") is None:
        return None
    doc.table("analysis")
    doc.unknown("analysis", _KEYS)
    d = AnalysisSettings()
    window = doc.seconds("analysis.window_s", default=d.window_s, hi=3600.0)
    interval = doc.seconds("analysis.interval_s", default=d.interval_s, hi=600.0)
    if interval < 1.0:
        raise doc.bad("analysis.interval_s", f"must be at least 1 second, not {interval:g}",
                      "scrapes closer than a second measure the scrape, not the server")
    if interval > window:
        raise doc.bad("analysis.interval_s", f"{interval:g} s is longer than window_s {window:g} s",
                      "make the interval at most the window")
    min_samples = doc.integer("analysis.min_samples", default=d.min_samples, lo=3, hi=1000)
    if window // interval < min_samples:
        raise doc.bad("analysis.min_samples", f"{min_samples} samples cannot fit: window_s {window:g} / interval_s "
                      f"{interval:g} gives {int(window // interval)}",
                      "lengthen window_s, shorten interval_s or lower min_samples")
    margin = doc.number("analysis.margin", default=d.margin, zero=True, hi=10.0)
    return AnalysisSettings(window_s=window, interval_s=interval, min_samples=min_samples, margin=margin,
                            thresholds=_thresholds(doc), load=_load(doc), source=doc.source)


def _thresholds(doc: TomlFile) -> tuple[Threshold, ...]:
    given = doc.table("analysis.thresholds")
    doc.unknown("analysis.thresholds", FIGURES)
    out = []
    for default in DEFAULT_THRESHOLDS:
        key = f"analysis.thresholds.{default.figure}"
        out.append(_threshold(doc, key, default.figure, given[default.figure])
                   if default.figure in given else default)
    return tuple(out)


def _threshold(doc: TomlFile, key: str, figure: str, value: Any) -> Threshold:
    higher = figure in HIGHER
    worse = "-" if higher else "+"
    example = f'{figure.rsplit(".", 1)[-1]} = "{worse}5%"'
    if value is False:
        return Threshold(figure)
    values = value if isinstance(value, list) else [value]
    if not 1 <= len(values) <= 2:
        raise doc.bad(key, f"must be one limit or a list of two, not {value!r}", f'e.g. {example} or ["{worse}5%", 10]')
    relative = absolute = None
    for v in values:
        if isinstance(v, str):
            m = _RELATIVE.match(v)
            if not m:
                raise doc.bad(key, f"{v!r} is not a percentage like \"{worse}5%\"",
                              f"write {example} (relative to the baseline) or a number (absolute)")
            if m.group(1) and m.group(1) != worse:
                raise doc.bad(key, f"{v!r} would demand a {'rise' if higher else 'drop'}: the limit says how much "
                              f"{'lower' if higher else 'higher'} than the baseline it may be",
                              f"write {example}")
            pct = float(m.group(2))
            if relative is not None or not 0 <= pct <= 1000:
                raise doc.bad(key, f"{v!r}: one relative limit from 0% to 1000%", f"write {example}")
            relative = pct
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            hi = 1.0 if figure == "error_rate" else 1e9
            if absolute is not None or not (0 <= v <= hi) or v != v:
                raise doc.bad(key, f"{v!r}: one absolute limit from 0 to {hi:g} ({_UNITS[figure]})",
                              f"e.g. {figure} = {0.01 if figure == 'error_rate' else 10}")
            absolute = float(v)
        else:
            raise doc.bad(key, f"must be a percentage string, a number or false, not {v!r}", f"e.g. {example}")
    return Threshold(figure, relative_pct=relative, absolute=absolute)


def _load(doc: TomlFile) -> LoadStep | None:
    if doc.get("analysis.load") is None:
        return None
    doc.table("analysis.load")
    doc.unknown("analysis.load", _LOAD_KEYS)
    prompts = doc.string("analysis.load.prompts", required=True, example="prompts/chat.jsonl")
    d = LoadStep(prompts=prompts)
    return LoadStep(prompts=prompts,
                    concurrency=doc.integer("analysis.load.concurrency", default=d.concurrency, lo=1, hi=4096),
                    # (SGLang's custom dataset refuses fewer than 4 output tokens)
                    output_len=doc.integer("analysis.load.output_len", default=d.output_len, lo=4, hi=1 << 20),
                    when=doc.choice("analysis.load.when", WHEN, default=d.when),
                    tokenizer=doc.string("analysis.load.tokenizer", required=False, example="/models/llama"))


# ----------------------------------------------------------------------------- overrides


def parse_override(text: str, *, source: str = "--analysis") -> tuple[str, Any]:
    """``"window_s=60"`` -> ("window_s", 60); the value is read as a TOML value when it is one
    (``60``, ``false``, ``["-5%", 800]``), else kept as written (``-5%``)."""
    key, sep, raw = str(text).partition("=")
    key = key.strip()
    if not sep or not key or not re.fullmatch(r"[a-z_]+(\.[a-z_0-9]+)*", key):
        raise BadInput(f"{source}: {text!r} is not KEY=VALUE; e.g. {source} window_s=60 or "
                       f"{source} thresholds.output_tps=-5%")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key, value


def apply_overrides(table: Any, overrides: Mapping[str, Any] | Iterable[tuple[str, Any]], *,
                    source: str | None, override_source: str = "--analysis") -> AnalysisSettings | None:
    """The host's ``[analysis]`` (``table``, as ``parse_analysis`` takes it) with ``overrides``
    (dotted keys: ``window_s``, ``thresholds.output_tps``, ``load.concurrency``) laid over it.
    The host's table is checked first (its messages name its file and line); the result with
    the overrides names ``override_source``. No table and no overrides: None."""
    pairs = list(overrides.items() if isinstance(overrides, Mapping) else overrides)
    base = parse_analysis(table, source=source)
    if not pairs:
        return base
    doc = _doc(table, source=source)
    merged: dict[str, Any] = _plain(doc.get("analysis") or {})
    for key, value in pairs:
        node = merged
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
    settings = parse_analysis(TomlFile.of({"analysis": merged}, source=override_source), source=override_source)
    return replace(settings, source=f"{source or '<inventory>'} with {override_source}") if settings else None


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


__all__ = ["AnalysisSettings", "DEFAULT_THRESHOLDS", "FIGURES", "HIGHER", "LOWER", "LoadStep", "Threshold",
           "apply_overrides", "parse_analysis", "parse_override"]
