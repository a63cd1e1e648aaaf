"""STAND-IN for an SGLang server under load, for `ddtree-deploy tune` tests: NOT SGLang.

`tune` launches the host's server once per configuration and drives it with SGLang's own
``python -m sglang.bench_serving``. This machine has no GPU, so the tests launch this
stdlib HTTP server instead. It takes the launch flags of ddtree_testkit/standin_server.py (reused
by import: ``standin_server.parse``) plus the DDTree top-K and its own model knobs, and
serves what bench_serving 0.5.12.post1 calls (read from its source), with SGLang's shapes
(the endpoints and the stream shared with standin_server.py: ddtree_testkit/standin_bench.py):

- ``GET /v1/models``: ``{"data": [{"id": <model path>}]}`` (bench's readiness check and
  model name);
- ``POST /generate`` with ``"stream": true`` and ``"text"`` or ``"input_ids"``: one chunk per
  decoding step (as SGLang streams a speculative step's accepted tokens together), then
  ``data: [DONE]``; without ``stream``: one JSON reply;
- ``POST /flush_cache`` (bench's ``--flush-cache``; 0.5.23's adds ``?timeout=``): 200;
- ``GET /server_info``: server args and ``internal_states[0].avg_spec_accept_length``
  (accepted tokens / verify steps over every request served, as SGLang's scheduler
  reports it; absent without speculation);
- ``GET /health_generate``, the ready log line: as the launch smoke expects.

The synthetic performance model (times in ms; C = requests decoding at that moment,
W = the verify width: 1 without speculation, the block (16) for the DFlash chain,
budget + 1 for DDTree):

    step time     = T0 + TD * [speculative] + TW * C * W      T0 = 30, TD = 6, TW = 0.6
    accept length = 1 (none), 3.0 (DFLASH chain),
                    1 + a_K * (1 - exp(-B / s_K)) (DDTREE, budget B, top-K K),
                    a_K = 2 + 2 * (1 - 1/K), s_K = 3K + 3

so accept length rises with the budget and saturates (sooner for a narrow tree, higher
for a wide one), while a step costs more as budget x concurrency grows: throughput per
top-K peaks at a middle budget. Each step accepts k tokens, k drawn from a geometric law
truncated at min(W, 16) whose mean is the accept length (so some steps accept one
token: p99 inter-token latency ~ a step's time). The draws and a +/-2 % step-time noise
come from a seeded generator (``--tune-seed``, the configuration and the request's
number): deterministic up to that noise and the machine's own timing jitter.

The prompt matters to acceptance, as it does on a real server (the paper reports it per
dataset): ``--accept-bonus WORD=DELTA`` adds DELTA to the accept length of every request
whose prompt holds WORD (capped at the verify width and 16), so the per-category figures of
a prompt file with two categories differ the way the test sets them. A batch request
(``"text": [...]``, non-streaming: the acceptance probe of `tune`) answers a list, one
reply per prompt, each with its ``meta_info`` (``completion_tokens``, ``spec_verify_ct``).

Failure knobs: ``--oom-budget N`` exits at start with a CUDA-OOM message when the budget
is >= N (memory for the verify width); ``--crash-budget N`` serves, then dies (exit 137,
like the OOM killer) on the first request of the measured run when the budget is >= N.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The launch smoke's stand-in (its flags and ready line): a package import under the tests,
# its sibling file when a sandbox host's Python runs this file as a script.
if __package__:
    from ddtree_testkit import standin_bench, standin_server
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import standin_bench  # noqa: E402
    import standin_server  # noqa: E402

T0, TD, TW = 30.0, 6.0, 0.6
CHAIN_ACCEPT = 3.0
DFLASH_BLOCK = 16
MAX_DEPTH = 16


def accept_length(algorithm: str | None, budget: int, topk: int | None) -> float:
    """The model's mean accept length (tokens per verify step, bonus token included)."""
    algo = (algorithm or "").upper()
    if algo == "DFLASH":
        return CHAIN_ACCEPT
    if algo != "DDTREE":
        return 1.0
    k = topk or 8
    a_k = 2.0 + 2.0 * (1.0 - 1.0 / k)
    s_k = 3.0 * k + 3.0
    return 1.0 + a_k * (1.0 - math.exp(-budget / s_k))


def verify_width(algorithm: str | None, budget: int) -> int:
    algo = (algorithm or "").upper()
    return DFLASH_BLOCK if algo == "DFLASH" else budget + 1 if algo == "DDTREE" else 1


def step_ms(algorithm: str | None, budget: int, active: int) -> float:
    speculative = (algorithm or "").upper() in ("DFLASH", "DDTREE")
    return T0 + (TD if speculative else 0.0) + TW * active * verify_width(algorithm, budget)


def continuation(mean: float, cap: int) -> float:
    """q such that a geometric law (P(k > j | k >= j) = q) truncated at ``cap`` has mean ``mean``."""
    if cap <= 1 or mean <= 1.0:
        return 0.0
    lo, hi = 0.0, 0.999999
    for _ in range(60):
        q = (lo + hi) / 2
        m = (1 - q ** cap) / (1 - q)
        lo, hi = (q, hi) if m < mean else (lo, q)
    return (lo + hi) / 2


def parse(argv):
    args, rest = standin_server.parse(argv)
    p = argparse.ArgumentParser(description="stand-in SGLang server under load (tune tests only)")
    p.add_argument("--tune-seed", type=int, default=0)
    p.add_argument("--oom-budget", type=int)
    p.add_argument("--crash-budget", type=int)
    p.add_argument("--accept-bonus", action="append", default=[])  # WORD=DELTA
    tune, unknown = p.parse_known_args(rest)
    return args, tune, unknown


def main(argv):
    args, tune, unknown = parse(argv)
    algo = args.speculative_algorithm
    budget, topk = args.speculative_ddtree_budget, args.speculative_ddtree_topk
    log = lambda msg: print(f"[stand-in {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    log(f"stand-in tune server (pid {os.getpid()}): algorithm {algo} budget {budget} topk {topk}")
    if args.pid_file:
        with open(args.pid_file, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    if algo and algo.upper() == "DDTREE" and tune.oom_budget is not None and budget >= tune.oom_budget:
        log("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
            f"(stand-in: budget {budget} >= --oom-budget {tune.oom_budget})")
        return 1
    mean = accept_length(algo, budget, topk)
    cap = min(verify_width(algo, budget), MAX_DEPTH)
    q = continuation(mean, cap)
    bonuses = [(w, float(d)) for w, _, d in (b.partition("=") for b in tune.accept_bonus)]

    def continuation_for(prompt) -> float:
        """The prompt's own acceptance: the model's, plus the bonus of each word it holds."""
        extra = sum(d for w, d in bonuses if w in str(prompt)) if algo and algo.upper() == "DDTREE" else 0.0
        return continuation(min(mean + extra, cap - 0.01), cap) if extra else q
    state = {"ready": False, "active": 0, "accepted": 0, "steps": 0, "requests": 0}
    lock = threading.Lock()
    info = {"model_path": args.model_path, "speculative_algorithm": algo,
            "speculative_draft_model_path": args.speculative_draft_model_path,
            "speculative_ddtree_budget": budget if algo else None, "speculative_ddtree_topk": topk,
            "host": args.host, "port": args.port, "unparsed_args": unknown, "stand_in": True}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            pass  # bench sends hundreds of requests: keep the log to what matters

        def _send(self, code, body=None):
            raw = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                return self._send(200 if state["ready"] else 503)
            found = standin_bench.model_reply(self.path, args.model_path)
            if found is not None:
                return self._send(200, found)
            if self.path in ("/server_info", "/get_server_info"):
                with lock:
                    st = {"effective_max_running_requests_per_dp": 48}
                    if algo and state["steps"]:
                        st["avg_spec_accept_length"] = state["accepted"] / state["steps"]
                return self._send(200, {**info, "internal_states": [st], "version": "stand-in"})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            if standin_bench.is_flush(self.path):
                return self._send(200)
            if self.path != "/generate":
                return self._send(404, {"detail": "Not Found"})
            if not state["ready"]:
                return self._send(503)
            with lock:
                state["requests"] += 1
                number = state["requests"]
            # The warmup request is the first; the measured run starts after it.
            if tune.crash_budget is not None and algo and algo.upper() == "DDTREE" \
                    and budget >= tune.crash_budget and number > 1:
                log("Killed (stand-in: the OOM killer, budget %d >= --crash-budget %d)" % (budget, tune.crash_budget))
                os._exit(137)
            n = standin_bench.max_new_tokens(body)
            rng = random.Random(f"{tune.tune_seed}:{algo}:{budget}:{topk}:{number}")
            prompts = body.get("text", body.get("input_ids"))
            if isinstance(prompts, list) and prompts and isinstance(prompts[0], str) and not body.get("stream"):
                # A batch (the acceptance probe): one reply per prompt, in order.
                return self._send(200, [self._decode(p, n, rng, None) for p in prompts])
            stream = standin_bench.Stream(self) if body.get("stream") else None
            reply = self._decode(prompts, n, rng, stream)
            if stream is not None:
                stream.end()
                return None
            return self._send(200, reply)

        def _decode(self, prompt, n, rng, stream):
            """Decode ``n`` tokens in real time (chunks to ``stream`` when streaming): the reply."""
            qp = continuation_for(prompt)
            done, steps, text = 0, 0, ""
            with lock:
                state["active"] += 1
            try:
                while done < n:
                    with lock:
                        active = state["active"]
                    time.sleep(step_ms(algo, budget, active) * (1 + rng.uniform(-0.02, 0.02)) / 1000.0)
                    k = 1
                    while k < cap and rng.random() < qp:
                        k += 1
                    k = min(k, n - done)
                    done, steps = done + k, steps + 1
                    text += " tok" * k
                    with lock:
                        state["accepted"] += k
                        state["steps"] += 1
                    if stream is not None:
                        stream.step(text, done, steps)
            finally:
                with lock:
                    state["active"] -= 1
            return {"text": text, "meta_info": {"completion_tokens": done, "spec_verify_ct": steps, "prompt_tokens": 0}}

    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"listening on {args.host}:{args.port}")
    time.sleep(args.ready_after)
    state["ready"] = True
    log(standin_server.READY_LINE)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
