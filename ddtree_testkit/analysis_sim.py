"""A deterministic simulation of the speed gate (serve/analysis.py) on noisy windows: how often
it rolls back equal builds (false rollbacks), and how often it catches a slower one.

Each trial draws a baseline and a new build's windows from the same synthetic server (the
stand-in's, ddtree_testkit/standin_server.py: a build ``slowdown`` slower takes
1 / (1 - slowdown) as long per step, so its tokens/s drop by ``slowdown`` and its
latencies rise by as much) with per-window noise, and asks ``analyse`` for a verdict. A
seeded generator makes every figure reproducible: the same settings and seed give the same
rates on every machine.

The noise, per window (``Noise``; "turned up" is ``LOUD``): a normal relative error on
each figure (tokens/s, accept length, p99 ITL, p99 TTFT), plus bursts: a share of windows
where a wave of long prompts slows decoding (tokens/s -20%, p99 ITL +40%, p99 TTFT x 2),
and idle windows with no traffic at all. Each window's p99 ITL and TTFT carry the width of
SGLang's histogram bucket they fall in (its default bounds, as the stand-in exports them), as
a window read from the server does: the analysis's resolution floor applies as on a host.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ddtree_deploy.serve.analysis import PASS, analyse
from ddtree_deploy.serve.figures import ServedFigures
from ddtree_deploy.settings.analysis import AnalysisSettings
from ddtree_testkit.standin_metrics import ITL_BUCKETS, TTFT_BUCKETS


@dataclass(frozen=True)
class Noise:
    tps: float = 0.02  # relative standard deviation per window
    accept: float = 0.01
    itl: float = 0.05
    ttft: float = 0.10
    bursts: float = 0.0  # share of windows hit by a burst
    idle: float = 0.0  # share of windows without traffic


QUIET = Noise()
LOUD = Noise(tps=0.05, accept=0.02, itl=0.10, ttft=0.20, bursts=0.05, idle=0.05)  # the noise turned up


@dataclass(frozen=True)
class Server:
    """The synthetic server's true figures (a build as fast as the baseline)."""

    output_tps: float = 1210.0
    accept_length: float = 3.4
    itl_p99_ms: float = 41.0
    ttft_p99_ms: float = 600.0
    running: float = 31.0
    request_rate: float = 2.1


def window(rng: random.Random, server: Server, noise: Noise, *, slowdown: float = 0.0,
           window_s: float = 10.0) -> ServedFigures:
    if rng.random() < noise.idle:
        return ServedFigures(window_s=window_s, release="sim", running=0.0, requests=0, aborted=0)
    burst = rng.random() < noise.bursts
    slower = 1.0 / (1.0 - slowdown)

    def jitter(x: float, sd: float) -> float:
        return max(0.0, x * (1.0 + rng.gauss(0.0, sd)))

    tps = jitter(server.output_tps / slower, noise.tps) * (0.8 if burst else 1.0)
    itl = jitter(server.itl_p99_ms * slower, noise.itl) * (1.4 if burst else 1.0)
    ttft = jitter(server.ttft_p99_ms * slower, noise.ttft) * (2.0 if burst else 1.0)
    requests = max(1, round(server.request_rate * window_s / slower))
    return ServedFigures(window_s=window_s, release="sim", algorithm="DDTREE", budget=64, topk=8,
                         accept_length=jitter(server.accept_length, noise.accept), output_tps=tps,
                         running=server.running, itl_p99_ms=itl, ttft_p99_ms=ttft, requests=requests, aborted=0,
                         request_rate=requests / window_s, error_rate=0.0,
                         itl_p99_bucket_ms=bucket_width_ms(itl, ITL_BUCKETS),
                         ttft_p99_bucket_ms=bucket_width_ms(ttft, TTFT_BUCKETS))


def bucket_width_ms(value_ms: float, bounds_s: tuple[float, ...]) -> float:
    """The width of SGLang's histogram bucket that ``value_ms`` lies in (as a window read from
    the server's histogram would carry it: the speed gate's resolution floor)."""
    lower = 0.0
    for bound in bounds_s:
        if value_ms <= bound * 1000:
            return (bound - lower) * 1000
        lower = bound
    return (bounds_s[-1] - bounds_s[-2]) * 1000


def trial(rng: random.Random, settings: AnalysisSettings, noise: Noise, slowdown: float,
          server: Server = Server()) -> str:
    n = settings.samples
    base = [window(rng, server, noise, window_s=settings.interval_s) for _ in range(n)]
    new = [window(rng, server, noise, slowdown=slowdown, window_s=settings.interval_s) for _ in range(n)]
    return analyse(base, new, settings).outcome


@dataclass(frozen=True)
class Rates:
    trials: int
    rolled_back: int  # verdicts other than pass (fail or inconclusive: both roll back)
    inconclusive: int

    @property
    def rate(self) -> float:
        return self.rolled_back / self.trials


def rates(settings: AnalysisSettings, noise: Noise, slowdown: float, *, trials: int = 2000, seed: int = 29) -> Rates:
    """How many of ``trials`` verdicts roll back, for builds ``slowdown`` slower than the baseline."""
    rng = random.Random(f"{seed}:{slowdown}:{noise}")
    outcomes = [trial(rng, settings, noise, slowdown) for _ in range(trials)]
    return Rates(trials=trials, rolled_back=sum(o != PASS for o in outcomes),
                 inconclusive=sum(o == "inconclusive" for o in outcomes))


__all__ = ["LOUD", "QUIET", "Noise", "Rates", "Server", "bucket_width_ms", "rates", "trial", "window"]
