"""How long the matrix takes over 16 cached SGLang releases (0.5.11 .. 0.5.23).

    python -m bench matrix_bench

Target (issue 7): under 10 s for 16 cached releases on 2 cores, with the time split
between download (here: verifying the cached wheels' sha256), apply and compile.

Runs the real family (the test family under tests/data/matrix_family when the real
one does not load), offline, from the cached listing and wheels; the first call
fills the cache from PyPI when needed and is reported separately, never timed as a
matrix run. Then, each the median of three runs:
- the parallel matrix (one worker process per core), as `ddtree-deploy matrix` runs it;
- the serial matrix (one process), the baseline the parallel one is compared with;
- the same parallel run with byte-compile timed on its own (worker CPU seconds), to
  split apply from compile.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.engine.series import load_family
from ddtree_deploy.release import releases
from ddtree_deploy.release.matrix_run import run_matrix, select_releases

REPO = Path(__file__).resolve().parent.parent
FROM, TO = "0.5.11", "0.5.23"
RUNS = 3


def _use_family() -> str:
    try:
        load_family(REPO / "patches" / "sglang-0.5.12")
        return "the real series (patches/)"
    except BadInput:
        os.environ["DDTREE_DEPLOY_PATCHES"] = str(REPO / "tests" / "data" / "matrix_family" / "patches")
        os.environ["DDTREE_DEPLOY_PAYLOAD"] = str(REPO / "tests" / "data" / "matrix_family" / "payload")
        return "the test family (tests/data/matrix_family; the real series does not load yet)"


def _fill_cache() -> list[str]:
    """Make sure the listing and the 16 wheels are cached (network only when they are not)."""
    listing = releases.list_releases(refresh=releases.cached_project() is None)
    versions = [str(r.version) for r in select_releases(listing, FROM, TO)]
    started = time.perf_counter()
    for v in versions:
        releases.ensure_wheel(v)
    print(f"cache ready: {len(versions)} releases {versions[0]} .. {versions[-1]} "
          f"({time.perf_counter() - started:.1f} s, including any download)")
    return versions


def _median(runs):
    return statistics.median(runs)


def main() -> None:
    print(f"family: {_use_family()}; cores: {os.cpu_count()}")
    try:
        versions = _fill_cache()
    except DeployError as exc:
        print(f"skipped: the wheels are not cached and PyPI is unreachable ({exc.message})")
        return

    def timed(**kwargs):
        m = run_matrix(from_version=FROM, to_version=TO, offline=True, **kwargs)
        assert len(m.rows) == len(versions)
        return m

    parallel = [timed().timings for _ in range(RUNS)]
    serial = [timed(jobs=1).timings for _ in range(RUNS)]
    split = [timed(measure_compile=True).timings for _ in range(RUNS)]

    def row(label, ts):
        print(f"{label:<28} total {_median([t.total for t in ts]):5.2f} s  "
              f"(listing {_median([t.listing for t in ts]):.2f}, "
              f"wheels {_median([t.download for t in ts]):.2f}, "
              f"apply+compile {_median([t.check for t in ts]):.2f}, "
              f"report {_median([t.report for t in ts]):.3f})")

    row(f"parallel ({os.cpu_count()} workers)", parallel)
    row("serial (1 process)", serial)
    p, s = _median([t.total for t in parallel]), _median([t.total for t in serial])
    print(f"parallel / serial: {p / s:.2f}x the time ({s / p:.2f}x faster)")
    check_cpu = _median([t.check_cpu for t in split])
    compile_cpu = _median([t.compile_cpu or 0.0 for t in split])
    print(f"worker CPU per run, summed over releases: read wheel + apply {check_cpu - compile_cpu:.2f} s, "
          f"byte-compile {compile_cpu:.2f} s ({compile_cpu / max(check_cpu, 1e-9):.0%} of the check work)")
    print(f"target: 16 cached releases under 10 s -> {'met' if p < 10 else 'NOT met'} ({p:.2f} s, "
          f"{len(versions)} releases)")
