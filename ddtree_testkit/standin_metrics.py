"""The STAND-IN server's speed model and its ``/metrics`` (NOT SGLang): what the stand-in of
ddtree_testkit/standin_server.py serves with ``--enable-metrics``, so the served figures,
the speed gate and its tests run without a GPU.

Stdlib only (a sandbox host's Python runs it beside standin_server.py). The metric names
are the pinned ones of the release the stand-in pretends to be, handed over in a JSON file
(``--metric-names``, written by ``write_names`` from ddtree_deploy/release/metric_names.py);
the text is Prometheus's exposition format as SGLang's ``prometheus_client`` writes it
(``# HELP``, ``# TYPE``, labelled samples; a histogram's cumulative ``_bucket`` samples
with SGLang's default bounds, ``_count`` and ``_sum``; counters' ``_total`` samples).

The model (times in ms; N = requests decoding at that moment):

    step time   T = step_ms x (1 + batch_cost x N) x slow x noise
    slow        = 1 / (1 - slowdown): a build ``slowdown`` slower (0.10: tokens/s -10%)
    noise       = 1 + a normal draw of sd ``noise``, redrawn every ``noise_period_s`` seconds
                  (so a 10 s window sees the noise of one or two draws, not of a thousand steps)
    tokens/step = accept_length on average: floor or ceil of it, drawn so the mean is exact
    TTFT        = 2 T (the prefill step, then the first decode step)

Each decode step of a request observes the inter-token latency as SGLang does (the step's
interval divided among the tokens it produced: k observations of T / k); a finished request
adds to the request and token counters and observes its end-to-end latency; an aborted one
(``abort_rate``) adds to the aborted counter instead. ``gen_throughput`` is the tokens
decoded over the last second (SGLang's is over its last log interval), the accept length
and rate gauges the mean over the same second (rate = (L - 1) / (W - 1) for a verify width
W), ``num_running_reqs`` the requests decoding now.

Traffic: ``clients`` synthetic clients (``--traffic N``) each send one request after the
other (``tokens`` output tokens each), from the moment the server is ready: a live
request stream without a benchmark. A request from outside (``POST /generate``) is counted
too. Every draw comes from generators seeded with ``seed``.

Where the slowdown comes from: ``slowdown_of(text)`` reads a marker line in the package
file the stand-in reads at start (``--package-file``), ``# ddtree-standin: slowdown=0.10``:
a test writes it into a patched file of a "slow build", and the server restarted on those
files serves slower, as a real server runs what it imported at start.
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time

SLOW_MARK = re.compile(r"#\s*ddtree-standin:\s*slowdown\s*=\s*([0-9.]+)")
# SGLang's default histogram bounds (metrics_collector.py, TokenizerMetricsCollector), seconds.
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
SCHEDULER_LABELS = (("model_name", "{model}"), ("engine_type", "unified"), ("tp_rank", "0"), ("pp_rank", "0"),
                    ("moe_ep_rank", "0"))
TOKENIZER_LABELS = (("model_name", "{model}"), ("engine_type", "unified"))


def write_names(path, release: str) -> None:
    """The pinned names of ``release`` as the JSON file ``--metric-names`` reads (tests only:
    it imports the toolkit's table, which the stand-in itself cannot)."""
    from dataclasses import asdict

    from ddtree_deploy.release.metric_names import names_for

    with open(path, "w") as fh:
        json.dump(asdict(names_for(release)), fh)


def slowdown_of(text: str | None) -> float:
    m = SLOW_MARK.search(text or "")
    return min(0.9, float(m.group(1))) if m else 0.0


class Histogram:
    def __init__(self, bounds):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: +Inf
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        i = next((i for i, b in enumerate(self.bounds) if value <= b), len(self.bounds))
        self.counts[i] += times
        self.sum += value * times


class Model:
    """The stand-in's served speed and what it exports (see the module docstring)."""

    def __init__(self, *, names: dict, model: str, algorithm: str | None, width: int, accept_length: float,
                 step_ms: float = 20.0, batch_cost: float = 0.02, slowdown: float = 0.0, noise: float = 0.0,
                 noise_period_s: float = 10.0, abort_rate: float = 0.0, seed: int = 0):
        self.names, self.model, self.algorithm = names, model, algorithm
        self.speculative = (algorithm or "").upper() in ("DDTREE", "DFLASH")
        self.width = width if self.speculative else 1
        self.accept = accept_length if self.speculative else 1.0
        self.step_ms, self.batch_cost = step_ms, batch_cost
        self.slow = 1.0 / (1.0 - slowdown)
        self.noise, self.noise_period_s, self.abort_rate = noise, noise_period_s, abort_rate
        self.seed = seed
        self.lock = threading.Lock()
        self.running = 0
        self.requests = self.aborted = self.tokens = 0
        self.itl, self.ttft, self.e2e = Histogram(ITL_BUCKETS), Histogram(TTFT_BUCKETS), Histogram(E2E_BUCKETS)
        self.noise_rng = random.Random(f"{seed}:noise")
        self.noise_factor, self.noise_until = 1.0, 0.0
        self.second = {"tokens": 0, "steps": 0, "accepted": 0, "since": time.monotonic()}
        self.gauges = {"gen_throughput": 0.0, "accept_length": 0.0, "accept_rate": 0.0}
        self.stop = threading.Event()

    # -- the model

    def _noise(self) -> float:
        now = time.monotonic()
        with self.lock:
            if now >= self.noise_until:
                self.noise_factor = max(0.2, 1.0 + self.noise_rng.gauss(0.0, self.noise)) if self.noise else 1.0
                self.noise_until = now + self.noise_period_s
            return self.noise_factor

    def step_s(self) -> float:
        with self.lock:
            n = self.running
        return self.step_ms * (1.0 + self.batch_cost * n) * self.slow * self._noise() / 1000.0

    def tokens_per_step(self, rng: random.Random) -> int:
        low = math.floor(self.accept)
        return int(low + (1 if rng.random() < self.accept - low else 0))

    def _roll(self) -> None:
        """Once a second: the gauges SGLang's scheduler logs over its last interval."""
        now = time.monotonic()
        s = self.second
        if now - s["since"] >= 1.0:
            self.gauges["gen_throughput"] = s["tokens"] / (now - s["since"])
            if s["steps"]:
                length = s["accepted"] / s["steps"]
                self.gauges["accept_length"] = length if self.speculative else 0.0
                self.gauges["accept_rate"] = (length - 1) / (self.width - 1) if self.speculative and self.width > 1 \
                    else 0.0
            self.second = {"tokens": 0, "steps": 0, "accepted": 0, "since": now}

    def serve_one(self, tokens: int, rng: random.Random, on_step=None) -> int:
        """Decode one request of ``tokens`` output tokens in real time; the tokens produced.
        ``on_step(done, steps)`` after each decoding step (a streamed reply's chunk)."""
        started = time.monotonic()
        aborted = rng.random() < self.abort_rate
        with self.lock:
            self.running += 1
        try:
            due = started + self.step_s()  # the prefill
            self._sleep_until(due)
            done = steps = 0
            while done < tokens and not self.stop.is_set():
                t = self.step_s()
                due += t
                self._sleep_until(due)
                k = max(1, min(self.tokens_per_step(rng), tokens - done))
                done, steps = done + k, steps + 1
                with self.lock:
                    if steps == 1:
                        self.ttft.observe(time.monotonic() - started)
                    else:
                        self.itl.observe(t / k, k)
                    s = self.second
                    s["tokens"] += k
                    s["steps"] += 1
                    s["accepted"] += k
                    self._roll()
                if on_step is not None:
                    on_step(done, steps)
                if aborted and done >= tokens // 2:
                    break
        finally:
            with self.lock:
                self.running -= 1
                if aborted:
                    self.aborted += 1
                else:
                    self.requests += 1
                    self.tokens += done
                    self.e2e.observe(time.monotonic() - started)
        return done

    @staticmethod
    def _sleep_until(due: float) -> None:
        """Steps keep to a schedule, not to sleeps of their own length: on a busy machine each
        sleep overruns by the scheduler's delay, a fixed cost that would dilute a slow build's
        10% into 2% (the speed gate's tests failed that way under load); a late step makes
        the next ones shorter, so the rate over a window is the model's."""
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def count_instant(self, tokens: int) -> None:
        """A request answered at once (the smoke's /generate): counted, with no latency of note."""
        with self.lock:
            self.requests += 1
            self.tokens += tokens

    def start_traffic(self, clients: int, tokens: int) -> None:
        for i in range(clients):
            rng = random.Random(f"{self.seed}:client:{i}")
            threading.Thread(target=self._client, args=(rng, tokens), daemon=True).start()

    def _client(self, rng: random.Random, tokens: int) -> None:
        while not self.stop.is_set():
            self.serve_one(tokens, rng)

    # -- /metrics

    def _labels(self, pairs, extra=()) -> str:
        items = [(k, v.replace("{model}", self.model)) for k, v in pairs] + list(extra)
        return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(items)) + "}"

    def text(self) -> str:
        n = self.names
        with self.lock:
            self._roll()
            gauges = {"running_reqs": float(self.running), "queue_reqs": 0.0, **self.gauges}
            if n.get("num_draft_tokens"):
                gauges["num_draft_tokens"] = float(self.width if self.speculative else 0)
            counters = {"requests": float(self.requests), "aborted": float(self.aborted),
                        "generation_tokens": float(self.tokens)}
            hists = {"itl": self.itl, "ttft": self.ttft, "e2e": self.e2e}
            hist_state = {k: (list(h.counts), h.sum) for k, h in hists.items()}
        out = []
        sched = self._labels(SCHEDULER_LABELS)
        for field, value in gauges.items():
            name = n.get(field)
            if name:
                out += [f"# HELP {name} stand-in {field}", f"# TYPE {name} gauge", f"{name}{sched} {value!r}"]
        tok = self._labels(TOKENIZER_LABELS, [("is_streaming", "false")])
        for field, value in counters.items():
            name = n.get(field)
            if name:
                out += [f"# HELP {name} stand-in {field}", f"# TYPE {name} counter", f"{name}{tok} {value!r}"]
        for field, hist in hists.items():
            name = n.get(field)
            if not name:
                continue
            counts, total = hist_state[field]
            out += [f"# HELP {name} stand-in {field}", f"# TYPE {name} histogram"]
            cumulative = 0
            for bound, count in zip(list(hist.bounds) + [math.inf], counts):
                cumulative += count
                le = "+Inf" if math.isinf(bound) else repr(float(bound))
                out.append(f"{name}_bucket{self._labels(TOKENIZER_LABELS, [('le', le)])} {float(cumulative)!r}")
            out.append(f"{name}_count{self._labels(TOKENIZER_LABELS)} {float(cumulative)!r}")
            out.append(f"{name}_sum{self._labels(TOKENIZER_LABELS)} {total!r}")
        return "\n".join(out) + "\n"

    # -- what the model predicts (for the tests: the figures a scrape should give)

    def expected_tps(self, clients: int, tokens: int) -> float:
        """Output tokens/s of ``clients`` closed-loop clients, no noise: each request spends
        a prefill step and ceil(tokens / L) decode steps, every step T at N = clients."""
        step = self.step_ms * (1.0 + self.batch_cost * clients) * self.slow / 1000.0
        steps = 1 + tokens / self.accept
        return clients * tokens / (steps * step)
