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

import time

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.release.metric_names import names_for
from ddtree_deploy.remote.transport import ProgramSession
from ddtree_deploy.serve import metrics
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.serve.serve_run import SERVE_PROGRAM


def scrape(host, transport, request: dict) -> dict:
    """Run one ``metrics`` request (``metrics.scrape_request``) and return the answer; the
    program's heartbeats are read on the way, its answer within ``metrics.scrape_deadline``."""
    limit = metrics.scrape_deadline(request)
    with ProgramSession(transport, host, SERVE_PROGRAM) as session:
        session.send(request, during="while sending the metrics request")
        deadline = time.monotonic() + limit
        while True:
            try:
                doc = session.read(deadline, what="the server's figures", during="the metrics scrapes")
            except TimeoutError:
                session.detach()
                raise DeployError(f"{host.name}: the serve program's scrapes did not end within {limit:g} s",
                                  code=Code.TIMEOUT,
                                  hint=f"the host may be overloaded; {next_step.status(host.name)}") from None
            if doc.get("event") == "done":
                break
    if not doc.get("ok"):
        raise DeployError(f"{host.name}: the metrics scrape failed: {doc.get('error')}", code=Code.SERVE_AGENT)
    return doc


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


__all__ = ["sample_windows", "scrape", "served_figures"]
