"""Fill the matrix from real release wheels: list, download (threads), apply (processes).

The I/O edge of ``matrix``: it lists SGLang releases (``releases``), makes sure a
verified wheel of each is cached (in parallel threads: downloads and sha256 checks
wait on the network and on hashlib, both of which release the GIL), then checks
each release in a worker process (applying and byte-compiling is CPU work, so
processes are what uses both cores). The result is a pure ``matrix.Matrix``.

Only the listing and the cache filling touch the network; with every wheel cached
(and the listing cached, or ``offline=True``), a run is fully offline.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from packaging.version import InvalidVersion, Version

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.progress import Counted
from ddtree_deploy.engine.check import check_series, compile_check
from ddtree_deploy.engine.series import (
    NO_FAMILY_HINT,
    NO_SUCH_FAMILY_HINT,
    FamilyInfo,
    PatchEntry,
    Series,
    families,
    family_folder,
    load_family,
    no_such_family,
    read_family_info,
    show,
)
from ddtree_deploy.release import releases
from ddtree_deploy.release.matrix import (
    Coverage,
    Matrix,
    ReleaseRow,
    Timings,
    assign,
    cell_from_entry,
    short_entry,
    sort_rows,
)
from ddtree_deploy.release.matrix_import import smoke_releases
from ddtree_deploy.release.facts import MARKERS, ReleaseFacts, describe, facts_from_names

Warn = Callable[[str], None]


def _version(text: str, what: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise BadInput(f"{what} {text!r} is not a valid PEP 440 version", hint="e.g. 0.5.11 or 0.5.13.post1") from None


def select_releases(
    all_releases: Sequence[releases.Release], from_version: str | None, to_version: str | None
) -> list[releases.Release]:
    """Releases in [from, to] (``to`` "latest" or None: no upper end) that have a wheel, not yanked.

    Pre-releases are left out: users upgrade hosts to releases.
    """
    low = _version(from_version, "--from") if from_version else None
    high = None if to_version in (None, "latest") else _version(to_version, "--to")
    if low is not None and high is not None and low > high:
        raise BadInput(f"--from {from_version} is newer than --to {to_version}")
    chosen = []
    for release in all_releases:
        v = release.version
        if v.is_prerelease or v.is_devrelease or release.yanked or not release.wheels:
            continue
        if (low is None or v >= low) and (high is None or v <= high):
            chosen.append(release)
    if not chosen:
        raise BadInput(
            f"no SGLang release with a wheel between {from_version or 'the first'} and {to_version or 'latest'}",
            hint="widen --from/--to; the first release with wheels is 0.5.11",
        )
    return chosen


def list_sglang_releases(*, offline: bool, warn: Warn) -> list[releases.Release]:
    """The release listing: fresh from PyPI, or the cached one when offline or unreachable."""
    if offline:
        doc = releases.cached_project()
        if doc is None:
            raise DeployError(
                "no cached SGLang release listing (needed for --offline)",
                hint="run once with network access to fill the cache",
            )
        return releases.list_releases(refresh=False)
    try:
        return releases.list_releases(refresh=True)
    except DeployError as exc:
        if exc.code != Code.NETWORK or releases.cached_project() is None:
            raise
        warn(f"{exc.message}; using the cached release listing")
        return releases.list_releases(refresh=False)


def fetch_wheels(versions: Sequence[str], *, jobs: int, progress: Counted | None) -> dict[str, Path]:
    """A verified cached wheel per version; downloads what is missing, several at a time."""
    out: dict[str, Path] = {}
    if progress:
        progress("download", 0, len(versions))
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(releases.ensure_wheel, v): v for v in versions}
        for done, future in enumerate(as_completed(futures), start=1):
            out[futures[future]] = future.result()
            if progress:
                progress("download", done, len(versions))
    return out


# ---------------------------------------------------------------------------
# One release, in a worker process


@dataclass(frozen=True)
class _Job:
    version: str
    wheel: Path
    family_folder: Path | None  # None: only the release facts
    family_name: str | None
    coverage: Coverage
    fact_paths: tuple[str, ...]
    fuzz: int
    measure_compile: bool = False


@dataclass(frozen=True)
class _Done:
    row: ReleaseRow
    seconds: float
    compile_seconds: float = 0.0  # only measured when asked (it compiles a second time)


@lru_cache(maxsize=None)
def _series(folder: str) -> Series:
    # Each worker parses a family once, however many releases it checks.
    return load_family(Path(folder))


def _check_one(job: _Job) -> _Done:
    started = time.perf_counter()
    series = _series(str(job.family_folder)) if job.family_folder is not None else None
    wanted = series.touched_paths() if series is not None else ()
    # One pass over the wheel (opening a large wheel's zip directory is most of the cost
    # here): the files to patch, plus the few whose presence the release facts read.
    found = releases.read_wheel_files(job.wheel, dict.fromkeys((*wanted, *job.fact_paths, *MARKERS)))
    facts = facts_from_names(job.version, found, job.fact_paths)
    if series is None:
        row = ReleaseRow(job.version, None, job.coverage, facts=facts)
        return _Done(row, time.perf_counter() - started)
    files = {path: found.get(path) for path in wanted}
    report = check_series(series, files, fuzz=job.fuzz)
    compile_seconds = 0.0
    if job.measure_compile:
        # check_series byte-compiles inside; to split apply from compile for the
        # benchmark, compile the same results once more and time only that.
        c0 = time.perf_counter()
        for patched in report.patched.values():
            if patched.path.endswith(".py"):
                compile_check(patched.path, patched.patched)
        compile_seconds = time.perf_counter() - c0
    row = ReleaseRow(
        version=job.version,
        family=job.family_name,
        coverage=job.coverage,
        cells=tuple(cell_from_entry(e) for e in report.entries),
        compile_errors=tuple(str(c) for c in report.compile_errors),
        facts=facts,
    )
    return _Done(row, time.perf_counter() - started - compile_seconds, compile_seconds)


def _fact_paths(loaded: Sequence[Series]) -> tuple[str, ...]:
    """Files the families *change* (not the ones they create), in first-use order."""
    seen: dict[str, None] = {}
    for s in loaded:
        for entry in s.entries:
            if isinstance(entry, PatchEntry):
                for fp in entry.file_patches:
                    if not fp.is_new:
                        seen.setdefault(fp.path, None)
    return tuple(seen)


def _why(row: ReleaseRow, history: Sequence[ReleaseFacts]) -> str:
    parts = []
    if row.coverage is Coverage.UNCOVERED:
        if row.applies:
            parts.append(f"newer than every family; {row.family} would apply cleanly")
        else:
            bad = [short_entry(c.entry) for c in row.cells if not c.ok]
            parts.append(f"newer than every family; {row.family} fails at {', '.join(bad) or 'compile'}")
    elif row.coverage is Coverage.NO_FAMILY:
        parts.append("no family's range contains it")
    if row.facts is not None:
        # A release its family covers cleanly needs no list of the files that only other
        # families touch ("spec.py not yet added" on 0.5.12 says nothing about 0.5.12).
        clean = row.coverage is Coverage.IN_RANGE and row.verdict != "failed"
        parts.append(describe(row.facts, () if clean else history, missing=not clean))
    return "; ".join(parts)


def run_matrix(
    *,
    from_version: str | None = "0.5.11",
    to_version: str | None = "latest",
    family: str | None = None,
    strict: bool = False,
    fuzz: int = 0,
    offline: bool = False,
    jobs: int | None = None,
    patches_dir: Path | None = None,
    progress: Counted | None = None,
    warn: Warn = lambda message: None,
    measure_compile: bool = False,
    import_smoke: bool = False,
) -> Matrix:
    """The series against every SGLang release in [from, to]; see ``matrix`` for the rules."""
    t0 = time.perf_counter()
    jobs = jobs or os.cpu_count() or 1
    _series.cache_clear()  # a family may have been edited since the last run in this process
    infos: list[FamilyInfo] = families(patches_dir)
    chosen = None
    if family is not None:
        folder = family_folder(family, patches_dir)
        if not folder.is_dir():
            raise BadInput(no_such_family(show(folder), patches_dir), hint=NO_SUCH_FAMILY_HINT)
        chosen = read_family_info(folder)
    if not infos and chosen is None:
        raise BadInput("no family under patches/", hint=NO_FAMILY_HINT)
    for info in infos:
        if info.unfinished and (chosen is None or chosen.folder != info.folder):
            warn(f"family {info.label} is not chosen by its range until its rejected hunks are placed; "
                 f"name it to check it anyway: --family {info.name}")

    listing = list_sglang_releases(offline=offline, warn=warn)
    selected = select_releases(listing, from_version, to_version)
    versions = [str(r.version) for r in selected]
    plan = {v: assign(v, infos, chosen) for v in versions}

    # Parse every family we will apply here, once: a broken patch is bad input (exit 2)
    # before any download starts.
    needed = {info.folder for info, _ in plan.values() if info is not None}
    loaded = {folder: load_family(folder) for folder in sorted(needed)}
    fact_paths = _fact_paths(list(loaded.values()) or [load_family(f.folder) for f in infos])

    t1 = time.perf_counter()
    wheels = fetch_wheels(versions, jobs=max(4, jobs), progress=progress)
    t2 = time.perf_counter()

    jobs_list = [
        _Job(v, wheels[v], info.folder if info else None, info.name if info else None, cov, fact_paths, fuzz,
             measure_compile)
        for v, (info, cov) in plan.items()
    ]
    if progress:
        progress("apply", 0, len(jobs_list))
    rows: list[ReleaseRow] = []
    check_cpu = compile_cpu = 0.0
    if jobs <= 1 or len(jobs_list) <= 1:
        done_iter = map(_check_one, jobs_list)
        for n, done in enumerate(done_iter, start=1):
            rows.append(done.row)
            check_cpu += done.seconds
            compile_cpu += done.compile_seconds
            if progress:
                progress("apply", n, len(jobs_list))
    else:
        with ProcessPoolExecutor(max_workers=min(jobs, len(jobs_list))) as pool:
            futures = [pool.submit(_check_one, j) for j in jobs_list]
            for n, future in enumerate(as_completed(futures), start=1):
                done = future.result()
                rows.append(done.row)
                check_cpu += done.seconds
                compile_cpu += done.compile_seconds
                if progress:
                    progress("apply", n, len(jobs_list))
    t3 = time.perf_counter()

    smokes = {}
    ts = time.perf_counter()
    if import_smoke:
        # Only where the series applied and compiled: an env for a broken series proves nothing.
        todo = [(r.version, wheels[r.version], loaded[plan[r.version][0].folder]) for r in rows if r.applies]
        smokes = smoke_releases(sorted(todo, key=lambda t: Version(t[0])), fuzz=fuzz, progress=progress)
    smoke_seconds = time.perf_counter() - ts
    history = [r.facts for r in rows if r.facts is not None]
    rows = [
        ReleaseRow(r.version, r.family, r.coverage, r.cells, r.compile_errors, r.facts, _why(r, history),
                   smokes[r.version].levels if r.version in smokes else ())
        for r in rows
    ]
    rows = sort_rows(rows)
    t4 = time.perf_counter()
    timings = Timings(
        listing=t1 - t0,
        download=t2 - t1,
        check=t3 - t2,
        report=t4 - t3 - smoke_seconds,
        smoke=smoke_seconds,
        total=t4 - t0,
        check_cpu=check_cpu,
        compile_cpu=compile_cpu if measure_compile else None,
    )
    known = [*infos, *([chosen] if chosen is not None else [])]
    return Matrix(rows=rows, timings=timings, strict=strict, families={f.name: (f.label, f.origin) for f in known})


__all__ = ["fetch_wheels", "list_sglang_releases", "run_matrix", "select_releases"]
