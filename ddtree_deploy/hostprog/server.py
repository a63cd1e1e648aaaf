"""A host program's server and processes: start one, wait until it is ready, stop its group.

Stdlib only, shipped with every host program that imports it (bundle.py). The lifecycle the
smoke program's launch level, the tune program, the serve program, the container program and
the speed gate's load step share, so each starts, waits for and stops a server or a command
the same way:

- ``start_server``: the GPU and port preconditions, then the server detached in a process
  group of its own, its output appended to its log; ``wait_ready``: ``/health_generate`` or
  the log's ready line, within a deadline; ``stop_group``: TERM, then KILL, the whole group.
- ``run_group``: one command (never a shell) in a group of its own, with a deadline, its
  output read back; ``own_env``: the environment that marks a process as ddtree-deploy's own.
- ``http_request``: one JSON request, (status, body), never an exception; ``log_tail``,
  ``tail``: what is kept of a log or an output in an answer.

A failure is a ``StepFailed``: one line, the evidence, and a ``code`` when the host (not the
series) is at fault. The smoke program raises the same class from its levels, so a level fails
the same way whether its server or its proof failed.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import wire

READY_LINE = "The server is fired up and ready to roll!"
# Output kept in an answer: enough to see the error, small enough to ship back.
TAIL_CHARS = 4000


class StepFailed(Exception):
    """A step failed (a smoke level, a server start, a wait, a command): ``detail`` is its one
    line, ``evidence`` what the report shows about why; ``code`` names a failure of the host
    rather than of the series (the tune program stops on those)."""

    def __init__(self, detail, evidence=None, code=None):
        super().__init__(detail)
        self.detail = detail
        self.evidence = evidence or {}
        self.code = code


def tail(text, limit=TAIL_CHARS):
    """The end of ``text`` (where an error is said), at most ``limit`` characters."""
    return text if len(text) <= limit else "..." + text[-limit:]


#: Set in the environment of every process a host program starts for itself (a probe
#: interpreter, the launch level's or a tune's server, bench_serving): inherited by their
#: children, it tells the serve program's discovery that they are ddtree-deploy's own, never
#: a serving SGLang (serve.scan). The inventory's restart and drain commands do not get it:
#: a server such a command starts is the one that serves.
OWN_ENV = "DDTREE_DEPLOY_HOST_PROGRAM"
OUTPUT_CAP = 16 << 20  # the most of a command's output read back (its end)


def own_env(program, bytecode=True):
    """The environment of a process ``program`` starts for itself (OWN_ENV set). ``bytecode``
    false: ``PYTHONDONTWRITEBYTECODE=1``, so its imports of SGLang write no ``__pycache__``
    beside the release's files (tune's servers and benchmarks, the speed gate's load step:
    they run outside a push's lock, and a host's files are only ever a push's to change)."""
    env = dict(os.environ, **{OWN_ENV: program})
    if not bytecode:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_group(argv, timeout_s, cwd=None, env=None, grace_s=5.0, own=None):
    """Run argv (never a shell) as the leader of a process group of its own, with a deadline.

    Past the deadline the WHOLE group is stopped (TERM, then KILL: ``stop_group``) and
    reaped, not only its first process: a child left running could act after the run that
    started it, outside its lock and unrecorded. ``own`` (the program's name): the command
    is the host program's own (a probe), so whatever it left in its group is stopped even
    when it ended in time; without it (the inventory's restart and drain commands) what
    stays in the group after the leader's exit is left alone: it may be the server.
    Output goes to an unnamed file, not a pipe, so a process that keeps the descriptor
    (a server started in the background) never holds the wait open.

    -> {"rc": exit code or None (timed out), "output": text, "stopped": stop_group's
    report when the group was stopped, else None}. A program that cannot be started: StepFailed.
    """
    if own:
        env = own_env(own) if env is None else dict(env, **{OWN_ENV: own})
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=cwd,
                                    env=env, start_new_session=True, close_fds=True)
        except OSError as exc:
            raise StepFailed(f"cannot run {argv[0]!r}: {exc.strerror}")
        stopped = None
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None or (own and group_pids(proc.pid)):
            stopped = stop_group(proc, grace_s)
        size = out.seek(0, os.SEEK_END)
        out.seek(max(0, size - OUTPUT_CAP))
        text = out.read().decode("utf-8", "replace")
    return {"rc": rc, "output": text, "stopped": stopped}


def package_root(name):
    """The folder holding the top-level package ``name`` (found without importing it)."""
    pkg = wire.find_package(name)
    if pkg is None:
        raise StepFailed(f"this interpreter ({sys.executable}) cannot find the {name} package")
    return os.path.dirname(pkg)


def check_gpus(min_free_mib, own):
    """nvidia-smi must exist and show at least one GPU with enough free memory. ``own``: the
    host program asking (``run_group``'s)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        raise StepFailed(
            "nvidia-smi not found on the host: the launch level needs an NVIDIA GPU "
            "(run the compile/import/cli levels only, or fix the host's driver install)",
            {"gpus": []}, code=Code.GPU,
        )
    query = [exe, "--query-gpu=index,name,memory.free,memory.total", "--format=csv,noheader,nounits"]
    done = run_group(query, 30, own=own)
    rc, out = done["rc"], done["output"]
    if rc != 0:
        raise StepFailed(f"nvidia-smi failed (exit {rc}): no usable GPU", {"output": tail(out)}, code=Code.GPU)
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[2].isdigit():
            gpus.append({"index": parts[0], "name": parts[1], "free_mib": int(parts[2]), "total_mib": int(parts[3])})
    if not gpus:
        raise StepFailed("nvidia-smi lists no GPU", {"output": tail(out)}, code=Code.GPU)
    if max(g["free_mib"] for g in gpus) < min_free_mib:
        raise StepFailed(
            f"no GPU has {min_free_mib} MiB free (another server running?)", {"gpus": gpus}, code=Code.GPU
        )
    return gpus


def _port_open(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def http_request(method, url, body=None, timeout=10.0):
    """(status, parsed JSON or text); status None when nothing answered."""
    # Imported here: only the steps that talk to a server need it, and urllib costs the
    # others (the compile, import and cli levels) ~0.1 s.
    import http.client
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError):
        # Nothing answered, or not with HTTP (a BadStatusLine from whatever holds the port,
        # a URL urllib cannot use): no HTTP status, so not healthy (yet), never an abort.
        return None, None
    try:
        return status, json.loads(raw.decode("utf-8", "replace") or "null")
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def log_tail(path, lines):
    """The last ``lines`` lines of the log at ``path`` ([] when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return []
    return text.splitlines()[-lines:]


def group_pids(pgid):
    """The pids still in a process group (Linux /proc; elsewhere just 'any or none')."""
    if os.path.isdir("/proc/self"):
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", "rb") as fh:
                    stat = fh.read().decode("utf-8", "replace")
            except OSError:
                continue
            # Fields after the ")" closing the command name: state ppid pgrp ...
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                pids.append(int(entry))
        return pids
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return []
    except PermissionError:
        pass
    return [pgid]


def stop_group(proc, grace_s):
    """TERM the whole process group, then KILL what is left, and reap the leader; report what
    happened: ``killed`` (how many of the group's processes were stopped), ``left`` (the pids
    that outlived TERM and KILL: another user's, e.g. under sudo)."""
    pgid = proc.pid  # start_new_session made the server its own group leader
    signals = []
    found = set(group_pids(pgid))
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        if not group_pids(pgid) and proc.poll() is not None:
            break
        try:
            os.killpg(pgid, sig)
            signals.append(sig.name)
        except (ProcessLookupError, PermissionError):  # none left, or none of them ours to signal
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if proc.poll() is not None and not group_pids(pgid):
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
    left = group_pids(pgid)
    return {"pgid": pgid, "signals": signals, "killed": len(found - set(left)), "left": left,
            "exit_code": proc.poll()}


def start_server(spec, evidence, own, bytecode=True):
    """Start the server of ``spec`` (the launch level's, or one tune configuration's)
    detached in its own process group, its output appended to ``log_path``, after its
    preconditions: a GPU with ``min_free_mib`` free (unless ``gpu_check`` is false) and a
    free port. ``own``: the host program starting it (OWN_ENV); ``bytecode``: as
    ``own_env``'s. -> the Popen; a failed precondition is a StepFailed with a ``code``."""
    host, port = spec.get("host", "127.0.0.1"), int(spec["port"])
    if spec.get("gpu_check", True):
        evidence["gpus"] = check_gpus(int(spec.get("min_free_mib", 0)), own)
    else:
        evidence["gpus"] = "not checked (the inventory says gpu = false)"
    if _port_open(host, port):
        # Something already answers there: probing it would test the wrong server.
        raise StepFailed(f"port {port} on {host} is already in use: stop that server or set another "
                         "[smoke.launch] port", evidence, code=Code.PORT)
    os.makedirs(os.path.dirname(spec["log_path"]) or ".", mode=0o700, exist_ok=True)
    argv = [sys.executable if a == "{python}" else a for a in spec["argv"]]
    with open(spec["log_path"], "ab") as log:
        try:
            return subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True, env=own_env(own, bytecode),
            )
        except OSError as exc:
            raise StepFailed(f"cannot start {argv[0]!r}: {exc.strerror}", evidence, code=Code.START)


def wait_ready(proc, spec, stop=None):
    """Until the server is ready: ``/health_generate`` 200 or the log's ready line, within
    ``ready_timeout_s``. -> how it showed. ``stop()``, when given, is called each poll (it
    raises to give up early: the tune program's abort)."""
    base = f"http://{spec.get('host', '127.0.0.1')}:{int(spec['port'])}"
    timeout_s = float(spec.get("ready_timeout_s", 900))
    deadline = time.monotonic() + timeout_s
    poll_s = float(spec.get("poll_s", 1.0))
    offset = 0
    while True:
        if stop is not None:
            stop()
        code = proc.poll()
        if code is not None:
            raise StepFailed(f"the server exited with code {code} before it was ready", {"exit_code": code})
        status, _ = http_request("GET", base + "/health_generate", timeout=min(10.0, poll_s + 5))
        if status == 200:
            return "/health_generate 200"
        offset, seen = _scan_log(spec["log_path"], offset, READY_LINE)
        if seen:
            return "log line"
        if time.monotonic() >= deadline:
            raise StepFailed(f"the server was not ready after {timeout_s:g} s", {"last_health_status": status})
        time.sleep(poll_s)


def _scan_log(path, offset, needle):
    """Look for needle in what the log gained since offset; (new offset, seen)."""
    try:
        with open(path, "rb") as fh:
            # Step back a little so a line split across two reads is still seen.
            fh.seek(max(0, offset - len(needle)))
            chunk = fh.read()
            return fh.tell(), needle.encode() in chunk
    except OSError:
        return offset, False
