"""STAND-IN for an SGLang server: NOT SGLang, used only where the real server cannot run.

The launch smoke level starts a real SGLang server on a GPU host. This machine has no
GPU, so the tests point the launch level at this small stdlib HTTP server instead. It
speaks the endpoints the smoke uses with SGLang's shapes (read from SGLang
0.5.12.post1's ``http_server.py``):

- ``GET /health_generate``: 503 while starting, 200 once ready;
- ``POST /generate``: ``{"text", "meta_info": {"completion_tokens", "spec_verify_ct"}}``;
- ``POST /generate`` with a list of texts: a list of such replies (SGLang's batch form);
- ``GET /server_info`` (and the older ``/get_server_info``): the server args, including
  ``speculative_algorithm`` exactly as given on the command line and
  ``speculative_ddtree_budget``, and ``internal_states[0]`` with
  ``avg_spec_accept_length`` and the DDTree report (CONTRACTS.md): ``ddtree_verify_width``
  (budget + 1), ``ddtree_worker_class`` (``--worker-class``) and ``ddtree_offchain_accepts``
  (a count that grows with the verify steps of the requests it served; a real server counts
  verify steps that accepted a path off the first-ranked chain);
- the log line "The server is fired up and ready to roll!" once ready.

It takes SGLang's launch flags (``--model-path``, ``--speculative-algorithm``, ``--port``,
...; unknown ones are kept and reported), so the tests check the argv the smoke builds,
and misbehaves on request (``--mode``) so the tests can exercise every failure path:

    ok            ready after --ready-after seconds (slow start when > 0)
    die-at-start  prints an error and exits 3 before listening
    never-ready   listens, but /health_generate stays 503 and no ready line
    empty-text    ready, but /generate returns empty text
    ignore-term   ready, ignores SIGTERM (only SIGKILL stops it)
    log-only      ready line in the log, /health_generate answers 404 (readiness by log)
    old-info      /server_info answers 404, /get_server_info answers (older SGLang)
    wrong-algo    reports speculative_algorithm DFLASH whatever it was given
    block-width   reports ddtree_verify_width = the draft block (16), as a partial port
                  that verifies the linear DFlash chain would
    chain-worker  reports ddtree_worker_class DFlashWorkerV2 (the chain worker of v2)
    no-offchain   ddtree_offchain_accepts stays 0 (every step accepted the first-ranked chain)
    no-tree-keys  internal_states carry no ddtree_* key (a series without the report)

Served speed (``--enable-metrics``, SGLang's own flag): ``GET /metrics`` answers Prometheus
text with the real metric names of the release the stand-in pretends to be
(``--metric-names FILE``, the pinned row of ddtree_deploy/release/metric_names.py as
JSON), from the synthetic model of ddtree_testkit/standin_metrics.py: a step time that
grows with the requests decoding, ``--accept-length`` tokens per step, ``--noise`` redrawn
every ``--noise-period-s`` seconds, and a SLOW BUILD: when the ``--package-file`` holds the
line ``# ddtree-standin: slowdown=0.10`` at start, every step takes 1 / (1 - 0.10) as long.
``--traffic N`` starts N synthetic clients sending requests of ``--traffic-tokens`` tokens
one after the other once ready (live traffic without a benchmark). Without
``--enable-metrics``, ``/metrics`` answers 404 as SGLang does.

SGLang's own benchmark (the speed gate's load step) can drive it: ``GET /v1/models``,
``POST /flush_cache`` and a streamed ``POST /generate`` as ddtree_testkit/standin_bench.py
(shared with the tune stand-in) serves them; with ``--enable-metrics`` each streamed request
is decoded in real time by the speed model (``Model.serve_one``: its step time, accept
length, the slow build's slowdown), so a benchmark's requests move the figures as the build's
speed does.

``--child`` also starts a worker child in the same process group (as SGLang starts its
scheduler and detokenizer processes), so the tests can check that stopping the group
leaves no process behind.

What it serves is read from the installed package, as a real server runs the code it
imported at start: ``--package-file REL`` reads ``REL`` (``sglang/srt/...``) under the
``sglang`` package of the interpreter running it (found without importing it) once, at
start, and ``/server_info`` reports ``stand_in_package: {"file", "sha256", "root"}``
(``sha256`` null when the file is absent), so a test sees which files a restarted server
picked up. ``--unhealthy-with REL`` never becomes ready (``/health_generate`` 503, no
ready line) when ``REL`` exists in that package at start: a change that breaks the server.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

READY_LINE = "The server is fired up and ready to roll!"

# What SGLang's benchmark asks (the speed gate's load step drives this server with it): a
# package import under the tests, its sibling file when a sandbox host's Python runs this file.
if __package__:
    from ddtree_testkit import standin_bench
else:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import standin_bench  # noqa: E402


def parse(argv):
    p = argparse.ArgumentParser(description="stand-in SGLang server (tests only)")
    p.add_argument("--mode", default="ok")
    p.add_argument("--ready-after", type=float, default=0.0)
    p.add_argument("--accept-length", type=float, default=3.5)
    p.add_argument("--child", action="store_true")
    p.add_argument("--pid-file")
    p.add_argument("--package-file")
    p.add_argument("--unhealthy-with")
    p.add_argument("--model-path", required=True)
    p.add_argument("--speculative-algorithm")
    p.add_argument("--speculative-draft-model-path")
    p.add_argument("--speculative-ddtree-budget", type=int, default=64)
    p.add_argument("--speculative-ddtree-topk", type=int)
    p.add_argument("--enable-metrics", action="store_true")
    p.add_argument("--metric-names")  # JSON: the pinned names of the release pretended to be
    p.add_argument("--traffic", type=int, default=0)  # synthetic clients, one request after the other
    p.add_argument("--traffic-tokens", type=int, default=64)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--batch-cost", type=float, default=0.02)
    p.add_argument("--noise", type=float, default=0.0)
    p.add_argument("--noise-period-s", type=float, default=10.0)
    p.add_argument("--abort-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speculative-dflash-block-size", type=int, default=16)
    p.add_argument("--worker-class", default="DFlashWorker")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    return p.parse_known_args(argv)


def package_file(rel, text=False):
    """(sha256 or None, package root) of ``rel`` under this interpreter's sglang package
    (``text``: and its text, or None)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return (None, None, None) if text else (None, None)
    root = os.path.dirname(os.path.abspath(list(spec.submodule_search_locations)[0]))
    try:
        with open(os.path.join(root, rel), "rb") as fh:
            data = fh.read()
    except OSError:
        return (None, root, None) if text else (None, root)
    digest = hashlib.sha256(data).hexdigest()
    return (digest, root, data.decode("utf-8", "replace")) if text else (digest, root)


def metrics_model(args, package_text):
    """The speed model of ddtree_testkit/standin_metrics.py for these flags (None: no metrics)."""
    if not args.enable_metrics:
        return None
    if __package__:
        from ddtree_testkit import standin_metrics
    else:  # run as a script on a sandbox host: its sibling file
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import standin_metrics
    names = {}
    if args.metric_names:
        with open(args.metric_names) as fh:
            names = json.load(fh)
    algo = (args.speculative_algorithm or "").upper()
    width = args.speculative_dflash_block_size if algo == "DFLASH" else args.speculative_ddtree_budget + 1
    return standin_metrics.Model(
        names=names, model=args.model_path, algorithm=args.speculative_algorithm, width=width,
        accept_length=args.accept_length, step_ms=args.step_ms, batch_cost=args.batch_cost,
        slowdown=standin_metrics.slowdown_of(package_text), noise=args.noise, noise_period_s=args.noise_period_s,
        abort_rate=args.abort_rate, seed=args.seed)


def main(argv):
    args, unknown = parse(argv)
    log = lambda msg: print(f"[stand-in {time.strftime('%H:%M:%S')}] {msg}", flush=True)
    log(f"stand-in server starting (pid {os.getpid()}, pgid {os.getpgid(0)}), mode {args.mode}")
    if args.pid_file:
        with open(args.pid_file, "a") as fh:
            fh.write(f"{os.getpid()}\n")
    if args.mode == "die-at-start":
        log("RuntimeError: stand-in told to die at start (like a CUDA OOM during load)")
        return 3
    if args.mode == "ignore-term":
        signal.signal(signal.SIGTERM, lambda *_: log("SIGTERM ignored"))
    if args.child:
        # Same process group (no new session): killing the group must reach it.
        child = subprocess.Popen(
            [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"]
            if args.mode == "ignore-term"
            else [sys.executable, "-c", "import time; time.sleep(3600)"]
        )
        log(f"worker child pid {child.pid}")
        if args.pid_file:
            with open(args.pid_file, "a") as fh:
                fh.write(f"{child.pid}\n")

    served, package_text = None, None
    if args.package_file:
        sha, root, package_text = package_file(args.package_file, text=True)
        served = {"file": args.package_file, "sha256": sha, "root": root}
        log(f"package file {args.package_file}: {sha or 'absent'} (root {root})")
    model = metrics_model(args, package_text)
    if model is not None:
        log(f"metrics: release {model.names.get('release')}, slowdown {1 - 1 / model.slow:.2f}, noise {args.noise}")
    broken = bool(args.unhealthy_with and package_file(args.unhealthy_with)[0])
    if broken:
        log(f"RuntimeError: {args.unhealthy_with} breaks this server: it will never be ready")
    state = {"ready": False, "offchain": 0, "streams": 0}
    lock = threading.Lock()
    algorithm = "DFLASH" if args.mode == "wrong-algo" else args.speculative_algorithm
    width = args.speculative_dflash_block_size if args.mode == "block-width" else args.speculative_ddtree_budget + 1
    worker = "DFlashWorkerV2" if args.mode == "chain-worker" else args.worker_class
    server_args = {
        "model_path": args.model_path,
        "speculative_algorithm": algorithm,
        "speculative_draft_model_path": args.speculative_draft_model_path,
        "speculative_ddtree_budget": args.speculative_ddtree_budget,
        "speculative_ddtree_topk": args.speculative_ddtree_topk,
        "enable_metrics": args.enable_metrics,
        "host": args.host,
        "port": args.port,
        "unparsed_args": unknown,
        "stand_in": True,
    }
    if served is not None:
        server_args["stand_in_package"] = served

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *a):
            log("http " + fmt % a)

        def _send(self, code, body=None, text=None):
            raw = text.encode() if text is not None else b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4" if text is not None else "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                if args.mode == "log-only":
                    return self._send(404, {"detail": "Not Found"})
                return self._send(200 if state["ready"] else 503)
            if self.path == "/metrics" and model is not None:
                return self._send(200, text=model.text())
            found = standin_bench.model_reply(self.path, args.model_path)
            if found is not None:
                return self._send(200, found)
            if self.path == "/server_info" and args.mode == "old-info":
                return self._send(404, {"detail": "Not Found"})
            if self.path in ("/server_info", "/get_server_info"):
                states = [{"avg_spec_accept_length": args.accept_length}]
                if args.mode != "no-tree-keys":
                    with lock:
                        states[0].update(ddtree_verify_width=width, ddtree_worker_class=worker,
                                         ddtree_offchain_accepts=state["offchain"])
                return self._send(200, {**server_args, "internal_states": states, "version": "stand-in"})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            if standin_bench.is_flush(self.path):
                return self._send(200)
            if self.path != "/generate":
                return self._send(404, {"detail": "Not Found"})
            if not state["ready"]:
                return self._send(503)
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            n = standin_bench.max_new_tokens(body)
            if body.get("stream"):
                return self._stream(n)
            texts = body.get("text", "")
            replies = [self._reply(t, n) for t in (texts if isinstance(texts, list) else [texts])]
            return self._send(200, replies if isinstance(texts, list) else replies[0])

        def _stream(self, n):
            """A streamed reply (SGLang's benchmark): with the speed model, decoded in real time,
            one chunk per step, so the load moves the figures as a build's speed does."""
            stream = standin_bench.Stream(self)
            if model is None:  # no speed model: the whole reply at once
                stream.step(" tok" * n, n, math.ceil(n / args.accept_length))
            else:
                with lock:
                    state["streams"] += 1
                    number = state["streams"]
                rng = random.Random(f"{args.seed}:stream:{number}")
                model.serve_one(n, rng, on_step=lambda done, steps: stream.step(" tok" * done, done, steps))
            stream.end()
            return None

        def _reply(self, prompt, n):
            text = "" if args.mode == "empty-text" else " Paris. (stand-in reply)"
            verify_ct = math.ceil(n / args.accept_length)
            if args.mode != "no-offchain":
                with lock:  # stand-in arithmetic: one verify step in three "accepted off-chain"
                    state["offchain"] += verify_ct // 3
            if model is not None:
                model.count_instant(n)
            meta = {"completion_tokens": n, "spec_verify_ct": verify_ct,
                    "prompt_tokens": len(str(prompt).split())}
            return {"text": text, "meta_info": meta}

    httpd = ThreadingHTTPServer((args.host, args.port), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    log(f"listening on {args.host}:{args.port}")
    if args.mode != "never-ready" and not broken:
        time.sleep(args.ready_after)
        state["ready"] = True
        log(READY_LINE)
        if model is not None and args.traffic:
            model.start_traffic(args.traffic, args.traffic_tokens)
    while True:  # serve until signalled, like the real server
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
