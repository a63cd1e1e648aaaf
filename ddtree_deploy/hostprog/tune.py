"""The host-side tune program: one server at a time, SGLang's bench_serving against it.

Stdlib only, run with the host's interpreter, shipped like every host program with the
modules it imports (bundle.py): ``wire`` (JSON lines, the heartbeat emitter, process
identity) and ``server``, the server lifecycle the smoke program's launch level uses too --
server start with its GPU and port checks, readiness wait, HTTP, process-group stop --
shared, not copied.

Protocol: JSON lines on stdin, JSON lines on stdout.

    {"op": "begin", "state_dir", "run_id", "holder", "series_id", "dataset_path": null | PATH,
     "prompt_files": [{"path": PATH, "text": "..."}] | null,   # the prompt sample's files, written
     "heartbeat_s": seconds between the "wait" events of a run (default: the smoke program's)}
        -> {"event": "ready", "lock": {...}, "bench_files": {"sglang/benchmark/serving.py": bool,
            "sglang/bench_serving.py": bool}} | {"event": "refused", "code", "message", ...}
    {"op": "run", "key", "argv", "host", "port", "log_path", "gpu_check", "min_free_mib",
     "ready_timeout_s", "term_grace_s", "expect_algorithm", "requests",
     "bench": {"argv": [...], "concurrency": [...], "timeout_s", "out_dir",
               "runs": [{"category", "args": [...], "requests"}] | null},
     "probe": {"prompts": {category: [text, ...]}, "max_new_tokens"} | null}
        -> {"event": "wait" | "phase", ...}* then {"event": "result", "key", "status", ...}
    {"op": "abort"} or end of input: stop what runs (server group, bench), release the
        tune lock, exit. {"op": "end"}: release the lock and exit.

With ``bench.runs`` (a prompt file by category), each concurrency is one benchmark run per
category (its ``args`` added: that category's dataset file and prompt count); the measure
is the runs together (output tokens / s = all their tokens over all their time; the p50s
weighted by completed requests, the p99s the worst of the runs) with each category's own
figures under ``categories``. ``probe`` then asks the server for each category's prompts
(one batch request each, greedy) and reads the accept length from SGLang's
``meta_info`` (completion tokens / verify steps): ``category_accept``.

What it touches on the host: the server and bench processes it starts (each in its own
process group, always stopped, with ``PYTHONDONTWRITEBYTECODE=1``: their imports of SGLang
write no bytecode beside the release's files, which are a push's alone), and
``<state_dir>/tune/``: ``lock/owner.json`` (the tune lock: two tunes never overlap) and ``<run_id>/`` (server and bench logs, bench results, the
prompt files).
It refuses to start, and stops before the next launch, while a push or rollback holds the
deploy lock of its install (``lock`` in the install's state folder: roots.py) or when the
deployed series changed under it. The tune lock is the machine's (its servers hold the GPUs);
its owner names the install whose files they run.
"""


import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import load, roots, server, wire

OOM_MARKS = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "killed")
METRICS = {  # bench_serving's result keys -> ours
    "output_tps": "output_throughput", "request_tps": "request_throughput",
    "ttft_p50_ms": "median_ttft_ms", "ttft_p99_ms": "p99_ttft_ms",
    "itl_p50_ms": "median_itl_ms", "itl_p99_ms": "p99_itl_ms",
    "completed": "completed", "accept_length": "accept_length",
}
HISTOGRAM_KEYS = ("spec_accept_histogram", "spec_correct_drafts_histogram", "accept_length_histogram")


class Aborted(Exception):
    pass


class RunFailed(Exception):
    def __init__(self, message, code=Code.FAILED, **extra):
        Exception.__init__(self, message)
        self.message, self.code, self.extra = message, code, extra


class Tuner(object):
    def __init__(self, emitter):
        self.emit = emitter.emit
        self.emitter = emitter
        self.abort = threading.Event()
        self.requests = queue.Queue()
        self.state_dir = None
        self.home = None  # this install's state folder in state_dir (its deploy lock and journal)
        self.lock_dir = None
        self.owner = None
        self.series_id = None

    # -- input: a reader thread, so an abort (or a lost connection) is seen mid-run

    def read_input(self, stream):
        for doc in wire.request_lines(stream):
            if doc is wire.NOT_JSON:
                continue
            if doc.get("op") == "abort":
                self.abort.set()
            self.requests.put(doc)
        self.abort.set()  # end of input: the controller is gone (Ctrl-C, killed, link cut)
        self.requests.put({"op": "eof"})

    # -- locks

    def begin(self, req):
        self.state_dir = os.path.normpath(os.path.expanduser(req["state_dir"]))
        self.series_id = req.get("series_id")
        package = wire.find_package("sglang")
        root = os.path.dirname(package) if package else sys.prefix
        # An earlier layout's folder that no install claimed yet: read as this one's (as status does).
        self.home = roots.locate(self.state_dir, root, lambda: True)
        deploy_lock = os.path.join(self.home, "lock")
        if os.path.isdir(deploy_lock):
            holder = wire.read_json(os.path.join(deploy_lock, "owner.json")) or {}
            return {"event": "refused", "code": Code.LOCKED,
                    "message": "a %s holds the host's deploy lock" % (holder.get("command") or "push/rollback"),
                    "holder": holder}
        path = req.get("dataset_path")
        if path and not os.path.isfile(os.path.expanduser(path)):
            return {"event": "refused", "code": Code.BAD_DATASET,
                    "message": "--dataset sharegpt-file: %s is not a file on the host" % path}
        bench_files = load.bench_files()  # the controller picks one: tune_run.bench_module
        problem = self._check_series()
        if problem:
            return {"event": "refused", "code": Code.SERIES_CHANGED, "message": problem}
        tune = os.path.join(self.state_dir, "tune")
        os.makedirs(tune, mode=0o700, exist_ok=True)
        self.lock_dir = os.path.join(tune, "lock")
        owner = {"run_id": req["run_id"], "holder": req.get("holder"), "command": "tune",
                 "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": socket.gethostname(),
                 "pid": os.getpid(), "pid_start": wire.process_start(os.getpid()),
                 "package_root": roots.resolved(root), "python": sys.executable}
        tmp = self.lock_dir + ".tmp-" + req["run_id"]
        shutil.rmtree(tmp, ignore_errors=True)
        os.mkdir(tmp, 0o700)
        with open(os.path.join(tmp, "owner.json"), "w") as fh:
            json.dump(owner, fh)
        took_over = None
        for _ in range(2):
            try:
                os.rename(tmp, self.lock_dir)  # atomic: of two tunes exactly one wins
                break
            except OSError:
                held = wire.read_json(os.path.join(self.lock_dir, "owner.json")) or {}
                if took_over is None and wire.same_process(held) is False:  # provably gone
                    took_over = held
                    shutil.rmtree(self.lock_dir, ignore_errors=True)
                    continue
                shutil.rmtree(tmp, ignore_errors=True)
                self.lock_dir = None
                return {"event": "refused", "code": Code.TUNE_LOCKED, "message": "another tune holds the tune lock",
                        "holder": held}
        self.owner = owner
        try:
            for spec in req.get("prompt_files") or ():
                self._write_prompts(spec)
        except (ValueError, OSError) as exc:
            self.release()
            return {"event": "refused", "code": Code.BAD_DATASET, "message": "the prompt files: %s" % exc}
        return {"event": "ready", "lock": owner, "took_over": took_over, "python": sys.executable,
                "bench_files": bench_files}

    def _write_prompts(self, spec):
        """A category's prompts, where the controller said: only under this run's tune folder."""
        path = os.path.normpath(os.path.expanduser(spec["path"]))
        tune = os.path.join(self.state_dir, "tune") + os.sep
        if not path.startswith(tune) or ".." in spec["path"].split("/"):
            raise ValueError("a prompt file outside the tune folder: %r" % spec["path"])
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with open(path, "w") as fh:
            fh.write(spec["text"])

    def release(self):
        if self.lock_dir and self.owner:
            held = wire.read_json(os.path.join(self.lock_dir, "owner.json")) or {}
            if held.get("run_id") == self.owner["run_id"]:
                shutil.rmtree(self.lock_dir, ignore_errors=True)
        self.lock_dir = None

    def _check_series(self):
        """None, or why the host is no longer what the sweep started measuring."""
        if os.path.isdir(os.path.join(self.home, "lock")):
            holder = wire.read_json(os.path.join(self.home, "lock", "owner.json")) or {}
            return "a %s took the deploy lock" % (holder.get("command") or "push/rollback")
        journal = wire.read_json(os.path.join(self.home, "journal.json")) or {}
        if self.series_id and (journal.get("series_id") != self.series_id or journal.get("phase") != "deployed"):
            return ("the deployed series changed (journal: %s, phase %s)"
                    % (journal.get("series"), journal.get("phase")))
        return None

    # -- one configuration

    def run(self, req):
        started = time.monotonic()
        result = {"event": "result", "key": req["key"], "log": req["log_path"]}
        proc = None
        try:
            problem = self._check_series()
            if problem:
                raise RunFailed(problem + ": the sweep stops here", code=Code.SERIES_CHANGED)
            try:
                proc = server.start_server(dict(req, gpu_check=bool(req.get("gpu_check"))), {}, own="tune",
                                           bytecode=False)
                server.wait_ready(proc, dict(req, poll_s=0.5), stop=self._stop_if_aborted)
            except server.StepFailed as exc:
                extra = {"exit_code": exc.evidence["exit_code"]} if "exit_code" in exc.evidence else {}
                raise RunFailed(exc.detail, code=exc.code or Code.FAILED, **extra)
            self.emit({"event": "phase", "key": req["key"], "what": "ready",
                       "seconds": round(time.monotonic() - started, 1)})
            measures = []
            for conc in req["bench"]["concurrency"]:
                measures.append(self._bench_all(proc, req, int(conc)))
                self.emit({"event": "phase", "key": req["key"], "what": "measured", "measure": measures[-1]})
            if req.get("probe"):
                result["category_accept"] = self._probe(req)
            info = self._server_info(req)
            states = (info or {}).get("internal_states") or [{}]
            state = states[0] if isinstance(states, list) and states and isinstance(states[0], dict) else {}
            result.update(status="ok", measures=measures, accept_length=state.get("avg_spec_accept_length"),
                          accept_histogram=next((state[k] for k in HISTOGRAM_KEYS if k in state), None),
                          algorithm=(info or {}).get("speculative_algorithm"))
            expected = req.get("expect_algorithm")
            found = (info or {}).get("speculative_algorithm")
            if info is not None and str(found or "None").upper() != str(expected or "None").upper():
                raise RunFailed("the server reports speculative_algorithm=%r, not %s" % (found, expected))
        except Aborted:
            result.update(status="aborted", error="interrupted")
        except RunFailed as exc:
            result.update(status="failed", error=exc.message, code=exc.code, **exc.extra)
        except Exception as exc:  # a bug here must still stop the server and answer
            result.update(status="failed", error="%s: %s" % (type(exc).__name__, exc), code=Code.AGENT)
        finally:
            if proc is not None:
                result["stopped"] = server.stop_group(proc, float(req.get("term_grace_s", 30)))
                if result["stopped"]["left"]:
                    result.update(status="failed", code=Code.LEFT_RUNNING,
                                  error="processes %s outlived TERM and KILL" % result["stopped"]["left"])
            if result.get("status") == "failed":
                result["log_tail"] = server.log_tail(req["log_path"], 30)
                if proc is not None and _looks_oom(result["log_tail"]):
                    result["error"] = "OOM: " + result["error"]
        result["seconds"] = round(time.monotonic() - started, 2)
        return result

    def _stop_if_aborted(self):
        if self.abort.is_set():
            raise Aborted()

    def _bench_all(self, proc, req, conc):
        """One concurrency: one benchmark run, or one per category (``bench.runs``)."""
        runs = req["bench"].get("runs")
        if not runs:
            return self._bench(proc, req, conc)
        parts = {}
        for run in runs:
            parts[run["category"]] = self._bench(proc, req, conc, extra=run["args"], requests=run["requests"],
                                                 tag="-" + run["category"])
        return combine(conc, parts)

    def _probe(self, req):
        """Each category's accept length on its own prompts: completion tokens / verify steps."""
        probe = req["probe"]
        base = "http://%s:%s" % (req["host"], req["port"])
        out = {}
        for category, texts in sorted(probe["prompts"].items()):
            if self.abort.is_set():
                raise Aborted()
            body = {"text": texts, "sampling_params": {"max_new_tokens": int(probe["max_new_tokens"]),
                                                       "temperature": 0}}
            status, reply = server.http_request("POST", base + "/generate", body, timeout=float(probe.get("timeout_s", 600)))
            replies = reply if isinstance(reply, list) else []
            tokens = sum((r.get("meta_info") or {}).get("completion_tokens") or 0 for r in replies
                         if isinstance(r, dict))
            steps = sum((r.get("meta_info") or {}).get("spec_verify_ct") or 0 for r in replies if isinstance(r, dict))
            out[category] = round(tokens / steps, 4) if status == 200 and steps else None
        return out

    def _bench(self, proc, req, conc, extra=(), requests=None, tag=""):
        bench = req["bench"]
        out_dir = bench["out_dir"]
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        out = os.path.join(out_dir, "%s-c%d%s.jsonl" % (req["key"], conc, tag))
        log_path = os.path.join(out_dir, "%s-c%d%s.bench.log" % (req["key"], conc, tag))
        for stale in (out,):
            if os.path.exists(stale):
                os.remove(stale)  # bench_serving appends: a rerun must not read an old line
        argv = [sys.executable if a == "{python}" else a for a in bench["argv"]]
        argv += list(extra) + ["--max-concurrency", str(conc), "--output-file", out]
        with open(log_path, "wb") as log:
            # Own session and a neutral folder: SGLang's bench imports the INSTALLED sglang.
            child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, close_fds=True, cwd=out_dir,
                                     env=server.own_env("tune", bytecode=False))
        deadline = time.monotonic() + float(bench.get("timeout_s", 3600))
        try:
            while child.poll() is None:
                if self.abort.is_set():
                    raise Aborted()
                code = proc.poll()
                if code is not None:
                    raise RunFailed("the server exited with code %s during the benchmark at concurrency %d"
                                    % (code, conc), exit_code=code)
                if time.monotonic() > deadline:
                    raise RunFailed("bench_serving at concurrency %d did not finish in %s s"
                                    % (conc, bench.get("timeout_s")))
                self.abort.wait(0.2)
        finally:
            if child.poll() is None or server.group_pids(child.pid):  # its workers too, even once it ended
                server.stop_group(child, 5.0)
        tail = server.log_tail(log_path, 15)
        if proc.poll() is not None:
            raise RunFailed("the server exited with code %s during the benchmark at concurrency %d"
                            % (proc.poll(), conc), exit_code=proc.poll(), bench_tail=tail)
        if child.returncode != 0:
            raise RunFailed("bench_serving exited %s at concurrency %d: %s"
                            % (child.returncode, conc, (tail or ["no output"])[-1][:300]), bench_tail=tail)
        doc = None
        try:
            with open(out) as fh:
                lines = [line for line in fh if line.strip()]
            doc = json.loads(lines[-1]) if lines else None
        except (OSError, ValueError):
            doc = None
        if not isinstance(doc, dict):
            raise RunFailed("bench_serving wrote no result at concurrency %d" % conc, bench_tail=tail)
        measure = {"concurrency": conc}
        for ours, theirs in METRICS.items():
            measure[ours] = doc.get(theirs)
        measure["duration_s"], measure["output_tokens"] = doc.get("duration"), doc.get("total_output_tokens")
        wanted = int(requests if requests is not None else req.get("requests", 0))
        if (measure["completed"] or 0) < wanted:
            raise RunFailed("only %s of %s requests completed at concurrency %d%s"
                            % (measure["completed"], wanted, conc, " (%s)" % tag[1:] if tag else ""),
                            bench_tail=tail)
        return measure

    def _server_info(self, req):
        base = "http://%s:%s" % (req["host"], req["port"])
        for endpoint in ("/server_info", "/get_server_info"):
            status, info = server.http_request("GET", base + endpoint, timeout=30)
            if status == 200 and isinstance(info, dict):
                return info
        return None


def combine(conc, parts):
    """One concurrency's measure from each category's run: all their output tokens over all
    their time (the runs follow each other), the p50s weighted by completed requests, the
    p99s the worst run's; each category's own under ``categories``."""
    done = sum(p.get("completed") or 0 for p in parts.values())
    seconds = sum(p.get("duration_s") or 0.0 for p in parts.values())
    tokens = sum(p.get("output_tokens") or 0 for p in parts.values())

    def weighted(key):
        known = [(p.get(key), p.get("completed") or 0) for p in parts.values() if p.get(key) is not None]
        weight = sum(w for _, w in known)
        return sum(v * w for v, w in known) / weight if weight else None

    def worst(key):
        known = [p.get(key) for p in parts.values() if p.get(key) is not None]
        return max(known) if known else None

    return {"concurrency": conc, "output_tps": tokens / seconds if seconds else None,
            "request_tps": done / seconds if seconds else None, "ttft_p50_ms": weighted("ttft_p50_ms"),
            "ttft_p99_ms": worst("ttft_p99_ms"), "itl_p50_ms": weighted("itl_p50_ms"),
            "itl_p99_ms": worst("itl_p99_ms"), "completed": done,
            # bench's reading of /server_info after the last run (the server's mean since start)
            "accept_length": list(parts.values())[-1].get("accept_length") if parts else None,
            "duration_s": seconds, "output_tokens": tokens, "categories": parts}


def _looks_oom(lines):
    text = "\n".join(lines or []).lower()
    return any(mark in text for mark in OOM_MARKS)


def main():
    emitter = wire.Emitter(sys.stdout.buffer, wire.HEARTBEAT_S)
    tuner = Tuner(emitter)
    # Unlike a push, a tune has nothing to finish when its controller goes: a hangup, a
    # Ctrl-C (a local run shares the terminal) or a TERM stops the server and exits.
    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: tuner.abort.set())
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    threading.Thread(target=tuner.read_input, args=(sys.stdin.buffer,), daemon=True).start()
    try:
        while True:
            try:
                req = tuner.requests.get(timeout=1.0)
            except queue.Empty:
                if tuner.abort.is_set():
                    break
                continue
            op = req.get("op")
            if op == "begin":
                if req.get("heartbeat_s") is not None:
                    # The controller's silence limit follows this interval: a new emitter,
                    # so the first beat of a run is one interval away, not the default's.
                    emitter.close()
                    emitter = wire.Emitter(sys.stdout.buffer, float(req["heartbeat_s"]))
                    tuner.emitter, tuner.emit = emitter, emitter.emit
                emitter.emit(tuner.begin(req))
            elif op == "run":
                if tuner.abort.is_set():
                    emitter.emit({"event": "result", "key": req.get("key"), "status": "aborted",
                                  "error": "interrupted"})
                    break
                emitter.current, emitter.started = req["key"], time.monotonic()
                answer = tuner.run(req)
                emitter.current = None
                emitter.emit(answer)
                if answer["status"] == "aborted":
                    break
            elif op in ("end", "eof", "abort"):
                break
    finally:
        tuner.release()
        emitter.emit({"event": "bye"})
        emitter.close()
    # Exit here, not through the interpreter's shutdown: the reader thread may sit inside a
    # read of stdin, and a shutdown with a daemon thread holding stdin's buffer lock aborts
    # (SIGABRT, exit 134: a third of the runs after "end"). Every answer is flushed already.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
