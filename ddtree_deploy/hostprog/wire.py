"""What every host program does the same way: JSON lines in and out, digests, process identity.

Shipped ahead of every host program (bundle.py); stdlib only, Python 3.8+ (a host's
interpreter may be old: tests/integration/test_hostprog.py parses every shipped module with 3.8's
grammar).

- Input: ``request_lines`` (a session's requests, one JSON line each: the agent's and the
  tune program's), ``one_request`` (the one request of the smoke and serve programs).
- Output: ``Emitter``, one JSON line per answer or event, with an optional heartbeat for a
  long wait. A closed stdout (the controller went away) stops the talking, never the work.
- ``keep_working``: a hangup or a broken pipe never stops a host program half-way.
- ``sha256_file``/``sha256_bytes`` (the same hex digests as ddtree_deploy.base.digests, which a
  host does not have), ``now_iso``/``iso_seconds``, ``read_json``, and a process's identity
  (``boot_id``, ``process_start``, ``same_process``) for the locks.

Test hooks: the one hook point
------------------------------
A test injects faults into a host program only through ``Hooks``, and a program consults
them nowhere else. The hooks arrive in the ``hooks`` object of a request (the deploy
agent's ``init``; the controller fills it from its one test hook point, ``base/hooks.py``,
which alone reads the environment for them), so no host
program reads its environment for them. None set (every real run): each method returns at
once and changes nothing. The names, each a step of the agent's apply:

==========================  ==============================================================
``stop_before_apply``       true: SIGSTOP before the apply reads anything (a test continues it)
``exit_after_staging``      true: exit 75 (killed) once the files are staged
``fill_after_staging``      [folder, slack]: fill that file system to ``slack`` free bytes
                            after the preflight passed (a real ENOSPC it could not foresee)
``exit_after_renames``      N: exit 75 right after the N-th rename of a switch
``stop_after_renames``      N: SIGSTOP right after the N-th rename, outside the lock's guard
``stop_in_guard_after_renames`` N: SIGSTOP right after the N-th rename, still holding the guard
``immutable_after_renames`` N: ``chattr +i`` the folder after the N-th rename (the next rename
                            and the switch back then really fail)
``no_hard_links``           true: ``link`` fails with EPERM, as on a file system without them
``stop_before_each_request`` FILE: append "<pid> <op>" to FILE, then SIGSTOP, before each request
==========================  ==============================================================
"""

import calendar
import errno
import hashlib
import json
import os
import signal
import socket
import sys
import time

HEARTBEAT_S = 20.0  # under any SSH read timeout, so a long wait is not taken for a dead link
HOOK_EXIT = 75  # the exit status of a program a test hook killed


# ---------------------------------------------------------------- digests, times, files


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sha256_bytes(data):
    return hashlib.sha256(data).hexdigest()


def now_iso():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def iso_seconds(text):
    """A ``now_iso`` time -> seconds since the epoch (None: not one)."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except (TypeError, ValueError):
        return None


def read_json(path):
    """The JSON document in ``path``, or None (absent, unreadable, not JSON)."""
    try:
        with open(path, "rb") as f:
            return json.loads(f.read().decode())
    except (OSError, ValueError):
        return None


def find_package(name):
    """The folder of the top-level package ``name`` as this interpreter would import it,
    found without importing it (importing sglang pulls torch and CUDA); None: not found."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return os.path.abspath(list(spec.submodule_search_locations)[0])


# ---------------------------------------------------------------- process identity (locks)


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def process_start(pid):
    """The process's start time in clock ticks since boot (Linux), to tell pid reuse apart;
    None: no such process (or no /proc)."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        # Field 22; the command name (field 2) may hold spaces, so split after its ')'.
        return stat.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def same_process(owner):
    """Whether the process a lock's ``owner`` names (``pid`` and ``pid_start``, on host
    ``host``) still runs: True, False (provably gone: that pid is free or another process
    now), or None (cannot tell: another host, no pid)."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return None
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return None
    start = process_start(pid)
    return start is not None and start == owner.get("pid_start")


# ---------------------------------------------------------------- JSON lines


def keep_working(*also):
    """A dropped connection must not stop a host program half-way: hangups (and ``also``,
    e.g. SIGINT for a local agent sharing the terminal) are ignored, and a broken pipe is
    an error on the write (see Emitter), never a signal."""
    for sig in (signal.SIGHUP, signal.SIGPIPE) + also:
        signal.signal(sig, signal.SIG_IGN)


NOT_JSON = object()  # what ``request_lines`` yields for a line that is not JSON


def request_lines(stream):
    """The requests on ``stream`` (bytes), one JSON line each, parsed; ``NOT_JSON`` for a line
    that is not JSON (the caller decides). A last line without its newline was cut
    mid-send (the connection dropped): it ends the input, never acted on."""
    for line in iter(stream.readline, b""):
        if not line.endswith(b"\n"):
            return
        try:
            yield json.loads(line.decode("utf-8"))
        except ValueError:
            yield NOT_JSON


def answer_lines(stream, emitter, hooks, handle, program):
    """A request loop (the agent's, the container program's): one answer per request line on
    ``stream`` until its end, through ``emitter``; a line that is not JSON ends it.

    Each request is checked against ``program``'s declaration (protocol.py: "agent",
    "container") before anything acts on it: a request that breaks it is answered with code
    ``protocol`` and the loop goes on. The first request must be an ``init`` naming this
    protocol version: else it and every request after it are refused, unanswered by
    ``handle`` (the controller is of another release). A request's ``hooks`` (a test's
    faults) update ``hooks`` first; ``stop_before_each_request`` acts."""
    from ddtree_deploy.base.codes import Code
    from ddtree_deploy.hostprog import protocol

    refusal = None
    for n, request in enumerate(request_lines(stream)):
        if request is NOT_JSON:
            emitter.emit({"ok": False, "code": Code.PROTOCOL, "message": "request is not JSON"})
            break
        if n == 0:
            refusal = protocol.hello_refusal(request)
        if refusal is not None:
            emitter.emit(refusal)
            continue
        try:
            request = protocol.check_request(program, request)
        except protocol.ProtocolError as exc:
            emitter.emit({"ok": False, "code": Code.PROTOCOL, "message": str(exc)})
            continue
        if request.get("hooks"):
            hooks.update(request["hooks"])
        hooks.before_request(request)
        emitter.emit(handle(request))


def read_request(argv=None):
    """The one request's bytes: the file named by the only argument, else one line of stdin."""
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        with open(argv[0], "rb") as fh:
            return fh.read()
    return sys.stdin.buffer.readline()


def one_request(argv, check):
    """The one request of a one-shot program (smoke, serve), parsed, after ``keep_working``.
    ``check(request)`` -> None, or why it is refused (a KeyError, ValueError or TypeError
    it raises is "bad request: ..."). A refused request is answered here with
    ``{"event": "done", "ok": false, "error": WHY}`` and None returned (the program exits 2)."""
    keep_working()
    raw = read_request(argv)
    try:
        request = json.loads(raw.decode("utf-8"))
        why = check(request)
    except (ValueError, KeyError, TypeError) as exc:
        why = "bad request: %s" % exc
    if why is None:
        return request
    print(json.dumps({"event": "done", "ok": False, "error": why}))
    return None


class Emitter(object):
    """One JSON line per answer or event on ``stream`` (bytes). With ``interval_s``, a
    heartbeat thread emits ``{"event": "wait", "level": current, "seconds"}`` while
    ``current`` names a long step, so the controller's silence limit never fires on it.

    A closed stream (the client went away) stops the talking, never the work: the agent
    finishes its request, the launch level still stops the server it started.
    """

    def __init__(self, stream, interval_s=None):
        import threading

        self.stream = stream
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.current = None
        self.started = time.monotonic()
        self.done = threading.Event()
        self.writable = True
        if interval_s is not None:
            threading.Thread(target=self._beat, daemon=True).start()

    def emit(self, doc):
        with self.lock:
            if not self.writable:
                return
            try:
                self.stream.write((json.dumps(doc, default=str) + "\n").encode())
                self.stream.flush()
            except (OSError, ValueError):
                self.writable = False

    def _beat(self):
        while not self.done.wait(self.interval_s):
            if self.current:
                self.emit({"event": "wait", "level": self.current,
                           "seconds": round(time.monotonic() - self.started, 1)})

    def close(self):
        self.done.set()


# ---------------------------------------------------------------- test hooks (see the docstring)


class Hooks(object):
    """The faults a test injects (the docstring's table); empty in every real run."""

    def __init__(self, hooks=None):
        self.hooks = dict(hooks or {})

    def update(self, hooks):
        self.hooks.update(hooks)

    def get(self, name):
        return self.hooks.get(name)

    def at(self, name, count=None, folder=None):
        """The step ``name`` is reached (the ``count``-th time, for the per-rename hooks): act
        when a test hooked it, else return at once."""
        value = self.hooks.get(name)
        if not value or (count is not None and value != count):
            return
        if name.startswith("exit_"):
            os._exit(HOOK_EXIT)  # the agent killed at this step
        elif name.startswith("stop_"):
            os.kill(os.getpid(), signal.SIGSTOP)  # stopped until the test continues it (SIGCONT)
        elif name.startswith("fill_"):
            fill_file_system(value)
        elif name.startswith("immutable_"):
            import subprocess

            subprocess.run(["chattr", "+i", folder], check=True)

    def before_request(self, request):
        """``stop_before_each_request``: every point between two requests held open."""
        log = self.hooks.get("stop_before_each_request")
        if not log:
            return
        with open(log, "a") as f:
            f.write("%d %s\n" % (os.getpid(), request.get("op")))
        os.kill(os.getpid(), signal.SIGSTOP)

    def link(self, src, dst):
        """``os.link``, failing as on a file system without hard links under ``no_hard_links``."""
        if self.hooks.get("no_hard_links"):
            raise OSError(errno.EPERM, "hard links refused (injected test fault)", src)
        os.link(src, dst)


def fill_file_system(folder_and_slack):
    """``fill_after_staging``: fill the file system of ``folder`` up to ``slack`` free bytes."""
    folder, slack = folder_and_slack
    st = os.statvfs(folder)
    size = max(0, st.f_frsize * st.f_bavail - int(slack))
    fd = os.open(os.path.join(folder, "ddtree-test-filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        block = b"\0" * (1 << 16)
        while size > 0:
            size -= os.write(fd, block[: min(len(block), size)])
    except OSError:
        pass
    finally:
        os.close(fd)
