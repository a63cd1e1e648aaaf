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

from ddtree_deploy.release.metric_names import names_for
from ddtree_deploy.serve import metrics, serve_run
from ddtree_deploy.serve.figures import ServedFigures, Unavailable


def scrape(host, transport, request: dict) -> dict:
    """Run one ``metrics`` request (``metrics.scrape_request``) and return the answer, within
    ``metrics.scrape_deadline`` (the program's heartbeats read on the way)."""
    return serve_run.answer(host, transport, request, limit_s=metrics.scrape_deadline(request),
                            what="the server's figures", step="metrics scrape")


def sample_windows(host, transport, *, url: str, release: str, interval_s: float, scrapes: int,
                   timeout_s: float = metrics.SCRAPE_TIMEOUT_S) -> list[ServedFigures | Unavailable]:
    """``scrapes`` scrapes ``interval_s`` apart: their ``scrapes - 1`` windows, in order (an
    ``Unavailable`` last where the scrapes stopped: the server went away or has no metrics)."""
    names = names_for(release)
    request = metrics.scrape_request(host.python, url, names, interval_s=interval_s, scrapes=scrapes,
                                     timeout_s=timeout_s)
    return metrics.windows(scrape(host, transport, request), names)


def served_figures(host, transport, *, url: str, release: str,
                   window_s: float = metrics.DEFAULT_WINDOW_S) -> ServedFigures | Unavailable:
    """The server's figures over one window of ``window_s`` (two scrapes)."""
    return sample_windows(host, transport, url=url, release=release, interval_s=window_s, scrapes=2)[0]


def sampler(host, connect, *, url: str, release: str | None):
    """``(interval_s, scrapes) -> windows`` of the host's server (``serve/bake.py``'s ``Sampler``),
    each call over a fresh connection from ``connect(host)``; read-only on the host."""
    def take(interval_s: float, scrapes: int) -> list[ServedFigures | Unavailable]:
        transport = connect(host)
        with transport:
            return sample_windows(host, transport, url=url, release=release or "", interval_s=interval_s,
                                  scrapes=scrapes)
    return take


__all__ = ["sample_windows", "sampler", "scrape", "served_figures"]
