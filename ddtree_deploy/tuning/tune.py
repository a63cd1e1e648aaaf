"""`tune`: which DDTree budget and top-K serve fastest on a host, and by how much (pure).

Everything here is decided from the options and the results so far, with no I/O, so a
sweep resumed from its results file makes exactly the choices the first run would have:

- ``TuneOptions`` / ``check_options``: the grid the user asked for, refused in one line
  when it is bad input (a budget or top-K < 1, an unknown baseline, > 64 launches
  without ``--yes``...);
- ``next_step``: the next configuration to launch (baselines, coarse budgets, refinement
  around the best, then the noise repeats), or None when the sweep is done;
- ``choose``: the explicit choice rule, its margin and the run-to-run noise;
- ``ranking`` and ``table_lines``: configurations ranked per concurrency, ratio to each
  baseline;
- the results file: one JSON line per finished configuration (``header`` first), read
  back by ``load_results`` for ``--resume``.

A configuration is one server launch: ``none`` (no speculation), ``dflash`` (the DFlash
chain) or ``ddtree`` with a budget and a per-depth top-K. Each launch is measured at
every ``--concurrency`` with SGLang's own benchmark; the choice is made at one
concurrency (``--at``, default the highest), and ``best_per_concurrency`` gives the best
configuration at every concurrency swept (baselines included), and ``plan`` the payload's
per-batch-size budget schedule it implies (``1:128/8,8:64/4,32:chain``, written with the
payload's own grammar: settings/budget_schedule.py), with what the schedule cannot carry.

The prompts: the operator's sample (``--prompts``, tuning/prompts.py), measured per
category, or random token ids (``random``, labelled as such: they say nothing about
acceptance), or a ShareGPT file on the host.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.settings import budget_schedule

BASELINES = ("dflash", "none")
MAX_GRID = 64  # launches allowed without --yes: each is a model load (minutes on a GPU)
MAX_BUDGET = 1024  # SGLang's DDTREE validation (patch 0003) refuses more
DEFAULT_BUDGETS = (16, 32, 64, 128, 256)
DEFAULT_TOPK = (1, 2, 4, 8)
DEFAULT_CONCURRENCY = (1, 8, 32)
# Pruning: along one top-K, budgets are tried upwards and the ascent stops once a budget
# is this much slower than that top-K's best so far (past the peak each step costs more).
DROP_STOP = 0.10
RESULTS_VERSION = 1


@dataclass(frozen=True, order=True)
class Config:
    kind: str  # "none" | "dflash" | "ddtree"
    budget: int | None = None
    topk: int | None = None

    @property
    def key(self) -> str:
        return self.kind if self.kind != "ddtree" else f"ddtree-b{self.budget}-k{self.topk}"

    @property
    def label(self) -> str:
        if self.kind == "ddtree":
            return f"DDTree B={self.budget} K={self.topk}"
        return {"dflash": "DFlash chain", "none": "no speculation"}[self.kind]

    @classmethod
    def from_key(cls, key: str) -> "Config":
        if key in BASELINES:
            return cls(key)
        parts = key.split("-")
        if len(parts) == 3 and parts[0] == "ddtree" and parts[1][:1] == "b" and parts[2][:1] == "k":
            return cls("ddtree", int(parts[1][1:]), int(parts[2][1:]))
        raise ValueError(f"not a configuration key: {key!r}")


@dataclass(frozen=True)
class TuneOptions:
    budgets: tuple[int, ...] = DEFAULT_BUDGETS
    topk: tuple[int, ...] = DEFAULT_TOPK
    concurrency: tuple[int, ...] = DEFAULT_CONCURRENCY
    baselines: tuple[str, ...] = BASELINES
    requests: int = 200
    input_len: int = 1024
    output_len: int = 512
    dataset: str = "random"  # "random" | "sharegpt-file" | "prompts"
    dataset_path: str | None = None  # on the host, for sharegpt-file
    prompts: str | None = None  # the prompt file on this machine, for "prompts" (tuning/prompts.py)
    prompts_digest: str | None = None  # its sha256: a resumed sweep must use the same sample
    categories: tuple[tuple[str, int], ...] = ()  # (category, prompts per benchmark run), for "prompts"
    probe_prompts: int = 8  # prompts per category the acceptance probe sends
    seed: int = 1
    at: int | None = None  # the concurrency the choice is made at (default: the highest)
    itl_margin_pct: float = 25.0
    repeats: int = 1  # extra runs of the best two and the first baseline (noise)

    @property
    def choose_at(self) -> int:
        return self.at if self.at is not None else max(self.concurrency)

    def bench_settings(self) -> dict:
        """What makes two runs comparable: a resumed sweep must match these exactly."""
        settings = {"concurrency": list(self.concurrency), "requests": self.requests,
                    "input_len": self.input_len, "output_len": self.output_len, "dataset": self.dataset,
                    "dataset_path": self.dataset_path, "seed": self.seed}
        if self.dataset == "prompts":  # (absent otherwise: results files made before prompts still resume)
            settings.update(prompts_digest=self.prompts_digest, categories=[list(c) for c in self.categories])
        return settings

    @property
    def dataset_label(self) -> str:
        """What the prompts were, said with every table."""
        if self.dataset == "prompts":
            cats = ", ".join(f"{c} {n}" for c, n in self.categories)
            return f"prompts: {self.prompts} ({cats} per run)"
        if self.dataset == "sharegpt-file":
            return f"prompts: ShareGPT text from {self.dataset_path} (on the host), cut to the lengths"
        return "prompts: RANDOM TOKEN IDS (they say nothing about acceptance: give --prompts FILE)"


def parse_ints(text: str, option: str, *, lo: int, hi: int, what: str) -> tuple[int, ...]:
    """``"16,32,64"`` -> (16, 32, 64): sorted, unique; one BadInput line otherwise."""
    values = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise BadInput(f"{option}: {part!r} is not a whole number; give a comma-separated list "
                           f"such as {option} 16,32,64") from None
        if not lo <= value <= hi:
            raise BadInput(f"{option}: {what} {value} is out of range; each must be from {lo} to {hi}")
        values.append(value)
    if not values:
        raise BadInput(f"{option}: empty list")
    return tuple(sorted(set(values)))


def parse_baselines(text: str) -> tuple[str, ...]:
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    for name in names:
        if name not in BASELINES:
            raise BadInput(f"--baseline: unknown baseline {name!r}; baselines are {', '.join(BASELINES)} "
                           "(comma-separated, the first is the one the choice rule compares with)")
    if not names:
        raise BadInput("--baseline: give at least one of " + ", ".join(BASELINES))
    return tuple(dict.fromkeys(names))


def grid_size(opts: TuneOptions) -> int:
    """Launches in the full grid, before pruning (what --yes guards)."""
    return len(opts.budgets) * len(opts.topk) + len(opts.baselines)


def check_options(opts: TuneOptions, *, yes: bool) -> None:
    """Bad input before anything connects or launches: one line, exit 2."""
    if opts.requests < 1:
        raise BadInput(f"--requests: {opts.requests} is not a positive number of requests")
    if opts.input_len < 1 or opts.output_len < 1:
        raise BadInput("--input-len/--output-len: lengths must be at least 1 token")
    if opts.choose_at not in opts.concurrency:
        raise BadInput(f"--at: concurrency {opts.choose_at} is not among --concurrency "
                       f"{','.join(map(str, opts.concurrency))}")
    if not 0 <= opts.itl_margin_pct <= 1000:
        raise BadInput(f"--itl-margin: {opts.itl_margin_pct:g} must be a percentage from 0 to 1000")
    if opts.repeats < 0 or opts.repeats > 5:
        raise BadInput(f"--repeats: {opts.repeats} must be from 0 to 5")
    if opts.dataset not in ("random", "sharegpt-file", "prompts"):
        raise BadInput(f"--dataset: {opts.dataset!r} is not random or sharegpt-file")
    if opts.dataset == "prompts" and not opts.categories:
        raise BadInput("--prompts: the prompt file gave no prompts")
    if opts.dataset == "sharegpt-file" and not opts.dataset_path:
        raise BadInput("--dataset sharegpt-file needs a PATH (a ShareGPT JSON file on the host)")
    n = grid_size(opts)
    if n > MAX_GRID and not yes:
        raise BadInput(f"the grid is {n} launches ({len(opts.budgets)} budgets x {len(opts.topk)} top-K + "
                       f"{len(opts.baselines)} baselines), over {MAX_GRID}: each is a model load; narrow "
                       "--budgets/--topk or pass --yes")


# ------------------------------------------------------------------ records


@dataclass(frozen=True)
class Measure:
    """One bench_serving run at one concurrency."""

    concurrency: int
    output_tps: float  # output tokens/s
    request_tps: float  # requests/s
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    completed: int = 0
    accept_length: float | None = None  # bench_serving's reading of /server_info
    categories: Mapping[str, Any] | None = None  # per category (a prompt file): its own run's figures

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Measure":
        return cls(**{k: doc.get(k) for k in cls.__dataclass_fields__ if k in doc})


@dataclass(frozen=True)
class Record:
    """One finished launch: its configuration, why it ran, and what it measured."""

    config: Config
    stage: str  # baseline | coarse | refine | repeat
    status: str  # ok | failed
    repeat: int = 0  # 0: the first run; 1..: the noise repeats
    measures: tuple[Measure, ...] = ()
    accept_length: float | None = None  # /server_info avg_spec_accept_length after the runs
    accept_histogram: Any = None  # when the server exposes one
    error: str | None = None
    seconds: float = 0.0
    log: str | None = None  # the server log's path on the host
    category_accept: Mapping[str, Any] | None = None  # per category: the probe's accept length

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def at(self, concurrency: int) -> Measure | None:
        return next((m for m in self.measures if m.concurrency == concurrency), None)

    def tps(self, concurrency: int) -> float:
        """Output tokens/s at ``concurrency``; 0 for a failed launch (it served nothing)."""
        m = self.at(concurrency) if self.ok else None
        return m.output_tps if m is not None else 0.0

    def to_json(self) -> dict:
        return {"kind": "run", "config": self.config.key, "stage": self.stage, "status": self.status,
                "repeat": self.repeat, "measures": [asdict(m) for m in self.measures],
                "accept_length": self.accept_length, "accept_histogram": self.accept_histogram,
                "error": self.error, "seconds": round(self.seconds, 2), "log": self.log,
                "category_accept": self.category_accept}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Record":
        return cls(config=Config.from_key(doc["config"]), stage=doc["stage"], status=doc["status"],
                   repeat=int(doc.get("repeat", 0)),
                   measures=tuple(Measure.from_json(m) for m in doc.get("measures") or ()),
                   accept_length=doc.get("accept_length"), accept_histogram=doc.get("accept_histogram"),
                   error=doc.get("error"), seconds=float(doc.get("seconds") or 0.0), log=doc.get("log"),
                   category_accept=doc.get("category_accept"))


def firsts(records: Iterable[Record]) -> dict[Config, Record]:
    """The first run of each configuration (repeats are for the noise only)."""
    out: dict[Config, Record] = {}
    for r in records:
        if r.repeat == 0:
            out.setdefault(r.config, r)
    return out


# ------------------------------------------------------------------ the sweep plan


@dataclass(frozen=True)
class Step:
    config: Config
    stage: str
    repeat: int = 0
    why: str = ""


def coarse_budgets(budgets: Sequence[int]) -> tuple[int, ...]:
    """Every other budget of the sorted list, always the smallest and the largest: the
    first pass; the budgets skipped here are tried only next to the best (refine)."""
    b = sorted(budgets)
    picked = set(b[::2]) | {b[0], b[-1]}
    return tuple(x for x in b if x in picked)


def next_step(opts: TuneOptions, records: Sequence[Record]) -> Step | None:
    """The next launch, decided from the records so far (pure: resume replays it).

    1. the baselines, in the order given;
    2. coarse: for each top-K (ascending), the coarse budgets upwards; a top-K's ascent
       stops at a failed launch (a larger verify width needs more memory) or once a
       budget is DROP_STOP slower than that top-K's best (past the peak);
    3. refine: around the best DDTree so far (at the choice concurrency), the budgets the
       coarse pass skipped next to its budget and the neighbouring top-K values at its
       budget; around each other top-K's best within DROP_STOP of it, the budgets next to
       that one; repeated until no centre moves;
    4. repeat: the best two eligible DDTree configurations and the first baseline run
       ``opts.repeats`` more times each, for the run-to-run noise.
    """
    at = opts.choose_at
    done = firsts(records)
    for name in opts.baselines:
        if Config(name) not in done:
            return Step(Config(name), "baseline", why="baseline")
    coarse = coarse_budgets(opts.budgets)
    for k in opts.topk:
        best = 0.0
        for b in coarse:
            c = Config("ddtree", b, k)
            r = done.get(c)
            if r is None:
                return Step(c, "coarse", why=f"coarse budget {b} at top-K {k}")
            if not r.ok:
                break
            tps = r.tps(at)
            if best and tps < best * (1 - DROP_STOP):
                break
            best = max(best, tps)
    # Hill climbing on the grid: each refinement that beats a centre becomes one, so its
    # own neighbours come next. Centres: the best DDTree so far, and the best budget of
    # every other top-K within DROP_STOP of it (a near-tie on the coarse grid must not
    # hide the peak between two coarse budgets of another top-K).
    best = _best_ddtree(done, at)
    if best is not None:
        centres = [best]
        for k in opts.topk:
            line = _best_ddtree({c: r for c, r in done.items() if c.topk == k}, at)
            if line is not None and line is not best and line.tps(at) >= best.tps(at) * (1 - DROP_STOP):
                centres.append(line)
        for centre in centres:
            for c in _neighbours(opts, centre.config, topk_too=centre is best):
                if c not in done:
                    return Step(c, "refine", why=f"next to {centre.config.label} "
                                                 f"({'the best' if centre is best else 'best of its top-K'} so far)")
    if opts.repeats:
        choice = choose(opts, records)
        wanted = [c for c in (choice.best, choice.second) if c is not None]
        if opts.baselines and Config(opts.baselines[0]) in done and done[Config(opts.baselines[0])].ok:
            wanted.append(Config(opts.baselines[0]))
        for c in wanted:
            runs = sum(1 for r in records if r.config == c)
            if runs < 1 + opts.repeats:
                return Step(c, "repeat", repeat=runs, why="noise: repeat the best two and the baseline")
    return None


def _best_ddtree(done: Mapping[Config, Record], at: int) -> Record | None:
    ok = [r for c, r in done.items() if c.kind == "ddtree" and r.ok and r.at(at) is not None]
    return max(ok, key=lambda r: (r.tps(at), -r.config.budget, -r.config.topk), default=None)


def _neighbours(opts: TuneOptions, c: Config, topk_too: bool = True) -> list[Config]:
    budgets, topk = sorted(opts.budgets), sorted(opts.topk)
    out = []
    i = budgets.index(c.budget)
    for j in (i - 1, i + 1):
        if 0 <= j < len(budgets):
            out.append(Config("ddtree", budgets[j], c.topk))
    if not topk_too:
        return out
    i = topk.index(c.topk)
    for j in (i - 1, i + 1):
        if 0 <= j < len(topk):
            out.append(Config("ddtree", c.budget, topk[j]))
    return out


# ------------------------------------------------------------------ the choice rule


@dataclass(frozen=True)
class Choice:
    """The rule: the best output tokens/s at concurrency ``at`` among DDTree configurations
    whose p99 ITL is within ``itl_margin_pct`` of the baseline's (the first baseline)."""

    at: int
    baseline: Config | None
    itl_limit_ms: float | None
    best: Config | None
    second: Config | None
    best_tps: float | None = None
    second_tps: float | None = None
    baseline_tps: float | None = None
    excluded: tuple[tuple[str, str], ...] = ()  # (config key, why)
    noise_pct: float | None = None  # max relative spread among repeated configurations
    noise_runs: dict = field(default_factory=dict)  # key -> [tps...]

    @property
    def gain_pct(self) -> float | None:
        if self.best_tps is None or not self.baseline_tps:
            return None
        return (self.best_tps / self.baseline_tps - 1) * 100

    @property
    def margin_pct(self) -> float | None:
        """How far the best is ahead of the runner-up."""
        if self.best_tps is None or not self.second_tps:
            return None
        return (self.best_tps / self.second_tps - 1) * 100

    def inside_noise(self, pct: float | None) -> bool | None:
        if pct is None or self.noise_pct is None:
            return None
        return abs(pct) <= self.noise_pct

    def lines(self, itl_margin_pct: float) -> list[str]:
        base = self.baseline.label if self.baseline else "no baseline"
        out = [f"choice rule: the best output tok/s at concurrency {self.at} among DDTree configurations "
               f"whose p99 ITL is within {itl_margin_pct:g}% of {base}'s"
               + (f" (<= {self.itl_limit_ms:.1f} ms)" if self.itl_limit_ms is not None
                  else " (not measured: no ITL limit applied)" if self.baseline else "")]
        for key, why in self.excluded:
            out.append(f"  excluded {key}: {why}")
        if self.best is None:
            out.append("no DDTree configuration qualifies: keep the host's current settings")
            return out
        line = f"chosen: {self.best.label}: {self.best_tps:.1f} tok/s"
        if self.gain_pct is not None:
            line += f", {self.gain_pct:+.1f}% vs {base} ({self.baseline_tps:.1f} tok/s)"
        out.append(line)
        if self.second is not None and self.margin_pct is not None:
            out.append(f"margin over the runner-up ({self.second.label}, {self.second_tps:.1f} tok/s): "
                       f"{self.margin_pct:+.1f}%")
        if self.noise_pct is None:
            out.append("run-to-run noise: not measured (--repeats 0)")
        else:
            out.append(f"run-to-run noise: {self.noise_pct:.1f}% (largest spread between repeated runs of "
                       + ", ".join(self.noise_runs) + ")")
            for what, pct in (("the margin over the runner-up", self.margin_pct), (f"the gain over {base}", self.gain_pct)):
                if self.inside_noise(pct):
                    out.append(f"NOTE: {what} ({pct:+.1f}%) is inside the noise: the difference is not proven")
        return out

    def to_json(self) -> dict:
        return {"at": self.at, "baseline": self.baseline.key if self.baseline else None,
                "itl_limit_ms": self.itl_limit_ms, "best": self.best.key if self.best else None,
                "budget": self.best.budget if self.best else None, "topk": self.best.topk if self.best else None,
                "best_tps": self.best_tps, "second": self.second.key if self.second else None,
                "second_tps": self.second_tps, "baseline_tps": self.baseline_tps, "gain_pct": self.gain_pct,
                "margin_pct": self.margin_pct, "noise_pct": self.noise_pct, "noise_runs": self.noise_runs,
                "margin_inside_noise": self.inside_noise(self.margin_pct),
                "gain_inside_noise": self.inside_noise(self.gain_pct),
                "excluded": [{"config": k, "why": w} for k, w in self.excluded]}


def choose(opts: TuneOptions, records: Sequence[Record]) -> Choice:
    at = opts.choose_at
    done = firsts(records)
    baseline = Config(opts.baselines[0]) if opts.baselines else None
    base_rec = done.get(baseline) if baseline else None
    base_m = base_rec.at(at) if base_rec is not None and base_rec.ok else None
    limit = base_m.itl_p99_ms * (1 + opts.itl_margin_pct / 100) if base_m is not None else None
    eligible, excluded = [], []
    for c, r in sorted(done.items()):
        if c.kind != "ddtree":
            continue
        m = r.at(at) if r.ok else None
        if m is None:
            excluded.append((c.key, f"failed: {r.error}" if not r.ok else f"not measured at concurrency {at}"))
        elif limit is not None and m.itl_p99_ms > limit:
            excluded.append((c.key, f"p99 ITL {m.itl_p99_ms:.1f} ms > {limit:.1f} ms"))
        else:
            eligible.append(r)
    eligible.sort(key=lambda r: (-r.tps(at), r.config.budget, r.config.topk))
    best = eligible[0] if eligible else None
    second = eligible[1] if len(eligible) > 1 else None
    runs: dict[str, list[float]] = {}
    for r in records:
        if r.ok and r.at(at) is not None:
            runs.setdefault(r.config.key, []).append(r.tps(at))
    repeated = {k: v for k, v in runs.items() if len(v) > 1}
    noise = None
    if repeated:
        noise = max((max(v) - min(v)) / (sum(v) / len(v)) * 100 for v in repeated.values())
    return Choice(at=at, baseline=baseline, itl_limit_ms=limit,
                  best=best.config if best else None, second=second.config if second else None,
                  best_tps=best.tps(at) if best else None, second_tps=second.tps(at) if second else None,
                  baseline_tps=base_m.output_tps if base_m is not None else None,
                  excluded=tuple(excluded), noise_pct=noise,
                  noise_runs={k: [round(x, 2) for x in v] for k, v in repeated.items()})


# ------------------------------------------------------------------ the table


def ranking(opts: TuneOptions, records: Sequence[Record]) -> dict[int, list[dict]]:
    """Per concurrency: every configuration's first run, fastest first, with the ratio of
    its tokens/s to each baseline's at that concurrency. Failed launches last."""
    done = firsts(records)
    out: dict[int, list[dict]] = {}
    for conc in opts.concurrency:
        base = {b: done[Config(b)].tps(conc) for b in opts.baselines if Config(b) in done}
        rows = []
        for c, r in done.items():
            m = r.at(conc) if r.ok else None
            row = {"config": c.key, "label": c.label, "kind": c.kind, "budget": c.budget, "topk": c.topk,
                   "status": r.status, "error": r.error,
                   "accept_length": r.accept_length, "category_accept": r.category_accept}
            if m is not None:
                row.update(asdict(m))
                row["ratio"] = {b: (m.output_tps / t if t else None) for b, t in base.items()}
            rows.append(row)
        rows.sort(key=lambda row: (row.get("output_tps") is None, -(row.get("output_tps") or 0), row["config"]))
        out[conc] = rows
    return out


def _categories(opts: TuneOptions) -> list[str]:
    """The categories the table shows columns for (none for one uncategorized sample)."""
    cats = [c for c, _ in opts.categories]
    return cats if len(cats) > 1 or (cats and cats[0] != "all") else []


def table_lines(opts: TuneOptions, records: Sequence[Record]) -> list[str]:
    lines = [opts.dataset_label]
    cats = _categories(opts)
    cat_heads = "".join(f" | {c[:12]:>12} tok/s {'acc':>5}" for c in cats)
    for conc, rows in ranking(opts, records).items():
        ratio_heads = "".join(f" {'vs ' + b:>9}" for b in opts.baselines)
        lines.append(f"concurrency {conc}:")
        lines.append(f"  {'#':>2} {'configuration':<22} {'tok/s':>9} {'req/s':>7} {'TTFT p50':>9} {'p99':>8} "
                     f"{'ITL p50':>8} {'p99':>7} {'accept':>6}{ratio_heads}{cat_heads}")
        for i, row in enumerate(rows, 1):
            if row.get("output_tps") is None:
                lines.append(f"  {'-':>2} {row['label']:<22} {row['status'].upper()}: {row['error'] or ''}"[:200])
                continue
            acc = f"{row['accept_length']:.2f}" if row.get("accept_length") else "-"
            ratios = "".join(f" {(f'{v:.2f}x' if v else '-'):>9}" for v in row["ratio"].values())
            ratios += "".join(f" {'-':>9}" for _ in range(len(opts.baselines) - len(row["ratio"])))
            per = ""
            for c in cats:
                part = (row.get("categories") or {}).get(c) or {}
                tps = part.get("output_tps")
                cacc = (row.get("category_accept") or {}).get(c)
                per += f" | {(f'{tps:.1f}' if tps is not None else '-'):>18} {(f'{cacc:.2f}' if cacc else '-'):>5}"
            lines.append(f"  {i:>2} {row['label']:<22} {row['output_tps']:>9.1f} {row['request_tps']:>7.2f} "
                         f"{row['ttft_p50_ms']:>9.1f} {row['ttft_p99_ms']:>8.1f} {row['itl_p50_ms']:>8.1f} "
                         f"{row['itl_p99_ms']:>7.1f} {acc:>6}{ratios}{per}")
    best = best_per_concurrency(opts, records)
    if best:
        implied = plan(opts, records)
        lines.append(f"best per concurrency (schedule {implied.text or '-'}):")
        for row in best:
            if row["config"] is None:
                lines.append(f"  concurrency {row['concurrency']:>5}: nothing measured")
                continue
            ratios = ", ".join(f"{v:.2f}x vs {b}" for b, v in row["ratio"].items() if v)
            lines.append(f"  concurrency {row['concurrency']:>5}: {row['label']:<22} {row['output_tps']:>9.1f} tok/s"
                         + (f"  ({ratios})" if ratios else ""))
        lines += [f"  note: {note}" for note in implied.notes]
    return lines


# ------------------------------------------------------------------ the best at every load


def schedule_part(config: Config) -> str:
    """A configuration as the payload's per-batch-size schedule writes it: ``64/4``, ``chain``
    (the DFlash chain) or ``none`` (no speculation)."""
    return f"{config.budget}/{config.topk}" if config.kind == "ddtree" else "chain" if config.kind == "dflash" \
        else "none"


def best_per_concurrency(opts: TuneOptions, records: Sequence[Record], *, exclude: Sequence[str] = ()) -> list[dict]:
    """For every concurrency swept, the fastest configuration there, baselines included: the
    same rule as the choice (a DDTree configuration counts only when its p99 ITL is within
    ``itl_margin_pct`` of the first baseline's at that concurrency), applied at each one.
    ``exclude``: kinds left out (``("none",)``: the fastest a budget schedule can serve)."""
    done = {c: r for c, r in firsts(records).items() if c.kind not in exclude}
    every = firsts(records)  # the baselines' figures for the ITL limit and the ratios
    out = []
    for conc in opts.concurrency:
        base_cfg = Config(opts.baselines[0]) if opts.baselines else None
        base = every.get(base_cfg) if base_cfg else None
        base_m = base.at(conc) if base is not None and base.ok else None
        limit = base_m.itl_p99_ms * (1 + opts.itl_margin_pct / 100) if base_m is not None and base_m.itl_p99_ms \
            else None
        eligible = []
        for c, r in done.items():
            m = r.at(conc) if r.ok else None
            if m is None or m.output_tps is None:
                continue
            if c.kind == "ddtree" and limit is not None and (m.itl_p99_ms or 0) > limit:
                continue
            eligible.append((c, m))
        eligible.sort(key=lambda cm: (-cm[1].output_tps, cm[0].kind != "ddtree", cm[0].budget or 0, cm[0].topk or 0))
        if not eligible:
            out.append({"concurrency": conc, "config": None})
            continue
        c, m = eligible[0]
        ratio = {b: (m.output_tps / every[Config(b)].tps(conc) if Config(b) in every and every[Config(b)].tps(conc)
                     else None) for b in opts.baselines}
        out.append({"concurrency": conc, "config": c.key, "label": c.label, "kind": c.kind, "budget": c.budget,
                    "topk": c.topk, "output_tps": m.output_tps, "itl_p99_ms": m.itl_p99_ms, "ratio": ratio,
                    "schedule": schedule_part(c)})
    return out


# The payload's schedule (payload/ddtree_schedule.py) serves a tree per running-batch range:
# THRESHOLD:BUDGET/TOPK or THRESHOLD:chain, the first threshold 1. ``plan`` writes the table
# into it with the payload's own writer (``budget_schedule.from_table``: runs of equal winners
# merge, the first concurrency becomes threshold 1) and says what it could not carry: where no
# speculation was fastest (the schedule has no entry without speculation) that concurrency
# gets the fastest configuration the schedule can serve there, by the same rule, and a note
# says what it costs; where nothing qualified, the entry before it carries on, said so.


@dataclass(frozen=True)
class SchedulePlan:
    """The schedule a sweep implies: its text (None: nothing the schedule can serve), the
    per-concurrency rows it was built from, and what it could not carry."""

    text: str | None
    rows: tuple[dict, ...]  # per concurrency: concurrency, best (key), served (key in the schedule), note
    notes: tuple[str, ...]
    differ: bool  # the fastest configuration is not the same at every concurrency swept
    why_none: str | None = None  # why ``text`` is None

    def to_json(self) -> dict:
        return {"schedule": self.text, "rows": [dict(r) for r in self.rows], "notes": list(self.notes),
                "winners_differ": self.differ, "why_none": self.why_none}


_NEIGHBOUR = ("another entry of the schedule serves that load (the one before it; for the lowest concurrency, "
              "the first entry, which starts at batch 1)")


def _tps(x: Any) -> str:
    return f"{x:,.1f}" if isinstance(x, (int, float)) else "?"


def plan(opts: TuneOptions, records: Sequence[Record]) -> SchedulePlan:
    best = best_per_concurrency(opts, records)
    servable = {row["concurrency"]: row for row in best_per_concurrency(opts, records, exclude=("none",))}
    table: list[tuple[int, object]] = []
    rows, notes = [], []
    for row in best:
        conc = row["concurrency"]
        served = row
        note = None
        if row["config"] is None:
            served, note = None, f"concurrency {conc}: nothing measured there; {_NEIGHBOUR}"
        elif row["kind"] == "none":
            alt = servable.get(conc) or {}
            if alt.get("config") is None:
                served, note = None, (f"concurrency {conc}: no speculation was fastest ({_tps(row['output_tps'])} "
                                      "tok/s) and no speculative configuration qualified there; the payload's "
                                      f"schedule has no entry without speculation: {_NEIGHBOUR}")
            else:
                served = alt
                loss = (alt["output_tps"] / row["output_tps"] - 1) * 100 if row["output_tps"] else None
                note = (f"concurrency {conc}: no speculation was fastest ({_tps(row['output_tps'])} tok/s), which "
                        "the payload's schedule cannot express (it has no entry without speculation): the schedule "
                        f"serves {alt['label']} there ({_tps(alt['output_tps'])} tok/s"
                        + (f", {loss:+.1f}% against no speculation" if loss is not None else "") + ")")
        if served is not None:
            table.append((conc, "chain" if served["kind"] == "dflash" else (served["budget"], served["topk"])))
        rows.append({"concurrency": conc, "best": row["config"], "served": served["config"] if served else None,
                     "note": note})
        if note:
            notes.append(note)
    differ = len({row["config"] for row in best if row["config"] is not None}) > 1
    if not table:
        return SchedulePlan(None, tuple(rows), tuple(notes), differ,
                            why_none="no configuration the schedule can serve was measured at any concurrency")
    try:
        text = budget_schedule.from_table(table)
    except budget_schedule.ScheduleError as exc:  # e.g. more distinct winners than entries allowed
        return SchedulePlan(None, tuple(rows), tuple(notes), differ, why_none=str(exc))
    return SchedulePlan(text, tuple(rows), tuple(notes), differ)


# ------------------------------------------------------------------ the results file


def header(host: str, opts: TuneOptions, identity: Mapping[str, Any]) -> dict:
    """The results file's first line: what every run in it was measured against.

    ``identity``: the deployed series (name, sha256), the SGLang version and the launch
    settings (model, draft): a resumed sweep must match them, or its numbers would mix
    two different servers."""
    return {"kind": "header", "version": RESULTS_VERSION, "host": host, "bench": opts.bench_settings(),
            "identity": dict(identity)}


def load_results(path: Path, expected: Mapping[str, Any]) -> list[Record]:
    """The finished runs of a results file, for ``--resume``; a file made for another host,
    series or benchmark is refused (one line: resuming it would mix incomparable numbers).
    A torn last line (the controller was killed mid-write) is ignored: that run reruns."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise BadInput(f"{path}: cannot read the results file ({exc.strerror})") from None
    lines = text.splitlines()
    records: list[Record] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            if n == len(lines) and not text.endswith("\n"):
                break
            raise BadInput(f"{path}:{n}: not a JSON line; the results file is damaged: move it away or "
                           "drop --resume") from None
        if n == 1:
            if doc.get("kind") != "header":
                raise BadInput(f"{path}:1: no header line: not a tune results file")
            for key in ("host", "bench", "identity"):
                if doc.get(key) != expected.get(key):
                    raise BadInput(f"{path}:1: made with different {key} ({_short(doc.get(key))} vs now "
                                   f"{_short(expected.get(key))}); resuming would mix incomparable runs: use "
                                   "another --out or drop --resume")
            continue
        if doc.get("kind") == "run":
            try:
                records.append(Record.from_json(doc))
            except (KeyError, TypeError, ValueError) as exc:
                raise BadInput(f"{path}:{n}: malformed run record ({exc})") from None
    return records


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def summary(opts: TuneOptions, records: Sequence[Record]) -> dict:
    """The --json document's body (the caller adds host, files, apply)."""
    implied = plan(opts, records)
    return {"options": {**asdict(opts), "choose_at": opts.choose_at}, "dataset_label": opts.dataset_label,
            "runs": [r.to_json() for r in records],
            "best_per_concurrency": best_per_concurrency(opts, records), "schedule": implied.text,
            "schedule_plan": implied.to_json(),
            "ranking": {str(k): v for k, v in ranking(opts, records).items()},
            "choice": choose(opts, records).to_json(),
            "failed": [r.config.key for r in records if not r.ok],
            "pruned": pruned(opts, records)}


def summary_line(opts: TuneOptions, records: Sequence[Record]) -> dict:
    """The results file's closing line (one per finished or resumed sweep; the last one holds):
    the best configuration at each concurrency and the per-batch-size schedule it implies,
    for the payload's ``--speculative-ddtree-budget-schedule``."""
    implied = plan(opts, records)
    return {"kind": "summary", "choice": choose(opts, records).to_json(),
            "best_per_concurrency": best_per_concurrency(opts, records), "schedule": implied.text,
            "schedule_plan": implied.to_json()}


def pruned(opts: TuneOptions, records: Sequence[Record]) -> list[str]:
    """The grid's DDTree configurations the sweep never launched (pruning skipped them)."""
    done = firsts(records)
    return [Config("ddtree", b, k).key for k in opts.topk for b in opts.budgets
            if Config("ddtree", b, k) not in done]
