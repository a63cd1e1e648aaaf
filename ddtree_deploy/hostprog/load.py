"""The speed gate's load step on the host: SGLang's own serving benchmark drives the server
while the serve program's ``metrics`` op samples it (``[analysis.load]``, docs/analysis.md).

Stdlib only, Python 3.8, shipped with the serve program (hostprog/serve.py's ``metrics`` op
with a ``load`` part). The benchmark's argv is the controller's (the one tune builds,
tuning/tune_run.bench_argv, with the module the release ships: ``bench_files``); this side
writes the prompt file, starts the benchmark, waits until it sends, and stops it.

The request's ``load`` part::

    {"argv": ["{python}", "-m", "sglang.bench_serving", ...],   # without the four options below
     "prompts": "...",            # SGLang's ``custom`` dataset lines (tuning/prompts.custom_lines)
     "requests": 512,             # lines written (the prompts cycled): --num-prompts
     "concurrency": 16,           # --max-concurrency
     "tag": "<run>-<side>",       # names its scratch folder (``ddtree-deploy-load-<tag>-...``)
     "ready_timeout_s": 300,      # from the start to its first measured request, at most
     "settle_s": 10,              # then this long before the first scrape (the load's ramp)
     "term_grace_s": 5}

The benchmark runs as one of the toolkit's own processes (``server.OWN_ENV`` = ``load``: the
serve program's discovery lists it under ``own``, never as a server), in a process group of
its own, from a private scratch folder (``tempfile.mkdtemp``: mode 0700 in the host's temp
folder, holding the prompt file, its log, its result file; removed when it stops: the
operator's prompts are not left on the host). It writes nothing else on the host: the speed
gate measures its baseline BEFORE the push takes the deploy lock, so neither the state
folder (a first push has none yet) nor anything beside SGLang's files may be touched here;
the benchmark runs with ``PYTHONDONTWRITEBYTECODE=1`` so importing SGLang writes no
``__pycache__`` into the release's package folder. Sending
starts after SGLang's benchmark prints ``Starting main benchmark run`` (its warm-up request
done); the scrapes wait for that. A run that finishes its requests before the windows end is
started again (a short gap in the load); one that exits with an error stops the scrapes and
is the answer's ``load.error``. The whole group is stopped (TERM, then KILL) and reaped when
the scrapes end, on any error, and when the controller goes away (Ctrl-C, a cut link): its
end of the link closes (end of input here) or a heartbeat cannot be written any more (the
emitter stops being writable).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from ddtree_deploy.hostprog import metrics, server

PROGRAM = "load"  # its OWN_ENV value: what the serve program's discovery calls it
READY_MARK = "Starting main benchmark run"  # SGLang's benchmark, 0.5.12.post1 to 0.5.23, after its warm-up
BENCH_FILES = ("sglang/benchmark/serving.py", "sglang/bench_serving.py")
LOG_LINES = 15


def bench_files():
    """Which of SGLang's serving benchmark modules the installed release ships (the controller
    picks one: tuning/tune_run.bench_module); the tune program asks the same."""
    from ddtree_deploy.hostprog import wire

    found = wire.find_package("sglang")
    root = os.path.dirname(found) if found else None
    return {rel: bool(root) and os.path.isfile(os.path.join(root, rel)) for rel in BENCH_FILES}


class Failed(Exception):
    pass


class Driver(object):
    """One load step: the benchmark started (and started again when it finishes early) until
    ``stop``; ``problem()`` says why the load is not what was asked (None while it is)."""

    def __init__(self, spec):
        self.spec = spec
        self.tag = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(spec.get("tag") or "run"))[:64]
        self.folder = None  # the private scratch folder: made by start(), removed by stop()
        self.log_path = None
        self.child = None
        self.runs = 0
        self.ready_s = None
        self.error = None
        self.stopped = []
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.started = time.monotonic()

    # -- the benchmark

    def _write_prompts(self):
        lines = [line for line in str(self.spec["prompts"]).splitlines() if line.strip()]
        if not lines:
            raise Failed("no prompts to send")
        path = os.path.join(self.folder, "prompts.jsonl")
        want = max(len(lines), int(self.spec.get("requests") or len(lines)))
        with open(path, "w") as fh:
            for i in range(want):
                fh.write(lines[i % len(lines)] + "\n")
        return path, want

    def _launch(self):
        path, count = self.prompt_file
        argv = [sys.executable if a == "{python}" else a for a in self.spec["argv"]]
        argv += ["--dataset-path", path, "--num-prompts", str(count),
                 "--max-concurrency", str(int(self.spec["concurrency"])),
                 "--output-file", os.path.join(self.folder, "result.jsonl")]
        # Its lines reach the log as printed; importing SGLang writes no bytecode beside its files.
        env = dict(server.own_env(PROGRAM, bytecode=False), PYTHONUNBUFFERED="1")
        with open(self.log_path, "ab") as log:
            # Own session and its own folder: SGLang's bench imports the INSTALLED sglang.
            self.child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True, close_fds=True, cwd=self.folder, env=env)
        self.runs += 1

    def start(self):
        # Private (0700) and its own: nothing of the host's state is touched before the lock.
        self.folder = tempfile.mkdtemp(prefix="ddtree-deploy-load-%s-" % self.tag)
        self.log_path = os.path.join(self.folder, "bench.log")
        self.prompt_file = self._write_prompts()
        self._launch()
        threading.Thread(target=self._watch, daemon=True).start()

    def _ready_in_log(self):
        try:
            with open(self.log_path, "rb") as fh:
                return READY_MARK.encode() in fh.read()
        except OSError:
            return False

    def _watch(self):
        """Until stopped: note when it first sends; start it again when it ends well; stop on
        an error (``error``, which stops the scrapes)."""
        deadline = self.started + float(self.spec.get("ready_timeout_s", 300))
        while not self.done.wait(0.1):
            with self.lock:
                if self.done.is_set():
                    return
                if self.ready_s is None and self._ready_in_log():
                    self.ready_s = round(time.monotonic() - self.started, 2)
                code = self.child.poll()
                if code is None:
                    if self.ready_s is None and time.monotonic() > deadline:
                        self.error = ("the benchmark sent no measured request within %g s of its start"
                                      % float(self.spec.get("ready_timeout_s", 300)))
                        return
                    continue
                self.stopped.append(server.stop_group(self.child, 1.0))  # its workers too, even once it ended
                if code != 0 or self.ready_s is None:
                    tail = server.log_tail(self.log_path, 1)
                    self.error = "the benchmark exited %s%s: %s" % (
                        code, "" if self.ready_s is not None else " before it sent a measured request",
                        (tail or ["no output"])[-1][:300])
                    return
                self._launch()  # it sent every request: again, so the load lasts the windows

    def problem(self):
        return self.error

    def wait_ready(self, gone):
        """Until the benchmark sends and then ``settle_s`` more (its requests all running: a
        server's gauges average over their last interval), None; or why it never will."""
        settled = None
        while True:
            if self.ready_s is not None:
                settled = settled or time.monotonic() + float(self.spec.get("settle_s", 0))
                if time.monotonic() >= settled:
                    return None
            if self.error:
                return self.error
            if gone():
                return gone()
            time.sleep(0.1)

    def stop(self):
        """Stop the whole group, reap it, remove the folder: the answer's ``load`` report."""
        with self.lock:
            self.done.set()
            child = self.child
        if child is not None and (child.poll() is None or server.group_pids(child.pid)):
            self.stopped.append(server.stop_group(child, float(self.spec.get("term_grace_s", 5))))
        tail = [line[:300] for line in server.log_tail(self.log_path, LOG_LINES)] if self.log_path else []
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
        left = sorted({pid for s in self.stopped for pid in s["left"]})
        return {"driven": True, "runs": self.runs, "ready_s": self.ready_s, "error": self.error,
                "killed": sum(s["killed"] for s in self.stopped), "left": left,
                "seconds": round(time.monotonic() - self.started, 2), "log_tail": tail}


# ---------------------------------------------------------------- the controller's presence


def watch_input(gone):
    """Set ``gone`` at the end of this program's input: the controller closed its end of the
    link (Ctrl-C, a cut connection). Raw reads of descriptor 0: no buffer lock is held by a
    thread left blocked in it when the program exits."""
    def read():
        try:
            while os.read(0, 4096):
                pass
        except OSError:
            pass
        gone.set()
    threading.Thread(target=read, daemon=True).start()


def scrape(request, emitter=None):
    """The serve program's ``metrics`` op: the scrapes (hostprog/metrics.py), under the load
    step when the request has a ``load`` part, and which benchmark modules the release ships
    when it asks (``bench_files``)."""
    spec = request.get("load")
    if not spec:
        answer = metrics.scrape(request, emitter)
        if request.get("bench_files"):
            answer["bench_files"] = bench_files()
        return answer
    gone = threading.Event()
    if request.get("watch_input", True):
        watch_input(gone)

    def away():
        if gone.is_set() or (emitter is not None and not emitter.writable):
            return "the controller went away (its link closed): the load step stopped"
        return None

    base = request["url"].rstrip("/")
    try:
        driver = Driver(spec)
    except Failed as exc:
        return {"ok": False, "error": "the load step: %s" % exc}
    try:
        if emitter is not None:
            emitter.current, emitter.started = "load", time.monotonic()
        try:
            driver.start()
            why = driver.wait_ready(away)
        except (Failed, OSError) as exc:
            why = driver.error = "the load step could not start the benchmark: %s" % exc
        if why:
            answer = {"ok": True, "url": base, "metrics": "stopped", "detail": why, "scrapes": [],
                      "server_info": None}
        else:
            answer = metrics.scrape(request, emitter, stop=lambda: driver.problem() or away())
    finally:
        report = driver.stop()
        if emitter is not None:
            emitter.current = None
    answer["load"] = report
    return answer
