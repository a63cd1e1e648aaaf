"""Reading a serving host's figures (the edge): the serve program's ``metrics`` op over the
host's transport, its answer parsed into ``ServedFigures`` (serve/metrics.py). Read-only on
the host: two or more GETs of the server's ``/metrics`` and one of ``/server_info``.

    served_figures(host, transport, url=..., release="0.5.23")          -> one window (status)
    sample_windows(host, transport, url=..., release=..., scrapes=13)   -> 12 windows (a bake)

``transport`` is opened by the caller (status shares the agent's connection). The release
picks the pinned metric names (release/metric_names.py): the host's SGLang version, as
the journal or the snapshot knows it.
"""

from __future__ import annotations

import itertools
import os
import time

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.release.metric_names import names_for
from ddtree_deploy.serve import loadstep, metrics, run as serve_run
from ddtree_deploy.serve.figures import ServedFigures, Unavailable

_TAGS = itertools.count(1)  # the load step's scratch folders on the host: one per request


def scrape(host, transport, request: dict) -> dict:
    """Run one ``metrics`` request (``metrics.scrape_request``) and return the answer, within
    ``metrics.scrape_deadline`` (the program's heartbeats read on the way)."""
    return serve_run.answer(host, transport, request, limit_s=metrics.scrape_deadline(request),
                            what="the server's figures", step="metrics scrape")


def sample_windows(host, transport, *, url: str, release: str, interval_s: float, scrapes: int,
                   timeout_s: float = metrics.SCRAPE_TIMEOUT_S,
                   load: loadstep.Plan | None = None) -> list[ServedFigures | Unavailable]:
    """``scrapes`` scrapes ``interval_s`` apart: their ``scrapes - 1`` windows, in order (an
    ``Unavailable`` last where the scrapes stopped: the server went away or has no metrics).
    ``load`` (the speed gate's load step): SGLang's benchmark drives the server during the
    scrapes (hostprog/load.py); a load that failed raises ``loadstep.LoadFailed``."""
    return windows_and_answer(host, transport, url=url, release=release, interval_s=interval_s, scrapes=scrapes,
                              timeout_s=timeout_s, load=load)[0]


def windows_and_answer(host, transport, *, url: str, release: str, interval_s: float, scrapes: int,
                       timeout_s: float = metrics.SCRAPE_TIMEOUT_S, load: loadstep.Plan | None = None,
                       bench_files: bool = False) -> tuple[list[ServedFigures | Unavailable], dict]:
    """``sample_windows``, and the serve program's answer (``bench_files``: it says which of
    SGLang's benchmark modules the release ships, for ``tune_run.bench_module``)."""
    names = names_for(release)
    request = metrics.scrape_request(host.python, url, names, interval_s=interval_s, scrapes=scrapes,
                                     timeout_s=timeout_s)
    if bench_files:
        request["bench_files"] = True
    if load is not None:
        tag = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{next(_TAGS)}"
        # The first scrape one interval after the benchmark sends: its ramp is no window's.
        request.update(load=dict(load.request(tag), settle_s=float(interval_s)),
                       heartbeat_s=loadstep.HEARTBEAT_S)
    answer = scrape(host, transport, request)
    if load is not None:
        _check_load(host, answer.get("load") or {})
    return metrics.windows(answer, names), answer


def _check_load(host, report: dict) -> None:
    """The load step's report (hostprog/load.py): its failure, or processes it could not stop."""
    if report.get("left"):
        raise loadstep.LoadFailed(f"{host.name}: the load step's benchmark processes "
                                  f"{', '.join(map(str, report['left']))} outlived TERM and KILL",
                                  code=Code.FAILED, hint=next_step.status(host.name))
    if report.get("error"):
        tail = "; ".join(str(x) for x in (report.get("log_tail") or ())[-3:])
        raise loadstep.LoadFailed(f"{host.name}: the load step ([analysis.load]) could not drive the server: "
                                  f"{report['error']}", code=Code.FAILED,
                                  hint=(f"the benchmark's last lines: {tail}" if tail else
                                        "run the benchmark by hand on the host to see why"))


def probe(host, connect, *, url: str, release: str | None, interval_s: float):
    """One window of the host's server and which benchmark modules its release ships
    (-> (window, {file: shipped})): what decides the load step (``loadstep.decide``)."""
    transport = connect(host)
    with transport:
        found, answer = windows_and_answer(host, transport, url=url, release=release or "", interval_s=interval_s,
                                           scrapes=2, bench_files=True)
    return found[0], answer.get("bench_files") or {}


def served_figures(host, transport, *, url: str, release: str,
                   window_s: float = metrics.DEFAULT_WINDOW_S) -> ServedFigures | Unavailable:
    """The server's figures over one window of ``window_s`` (two scrapes)."""
    return sample_windows(host, transport, url=url, release=release, interval_s=window_s, scrapes=2)[0]


def sampler(host, connect, *, url: str, release: str | None, load: loadstep.Plan | None = None):
    """``(interval_s, scrapes) -> windows`` of the host's server (``serve/bake.py``'s ``Sampler``),
    each call over a fresh connection from ``connect(host)``; read-only on the host but for
    ``load`` (the load step: the benchmark's private scratch folder in the host's temp folder,
    removed after; nothing of the host's state: this runs before a push's lock)."""
    def take(interval_s: float, scrapes: int) -> list[ServedFigures | Unavailable]:
        transport = connect(host)
        with transport:
            return sample_windows(host, transport, url=url, release=release or "", interval_s=interval_s,
                                  scrapes=scrapes, load=load)
    return take


__all__ = ["probe", "sample_windows", "sampler", "scrape", "served_figures", "windows_and_answer"]
