"""The host-side serve program: which SGLang server processes run from the deployed package,
and the restart of the serving server through the inventory's own command, gated on its
health and on the DDTree proof.

Stdlib only, run with the host's interpreter (``host.python``), shipped like every host
program with the modules it imports (bundle.py): ``wire``, ``server`` (the command runs
with a deadline, the HTTP request, the process-group stop) and the smoke program ``smoke``
(its ``/server_info`` tree proof). It never changes the installed files
and never builds a shell command: the restart and drain commands are argv lists from the
inventory, run with ``subprocess`` as they are written.

Request (one JSON line)::

    {"op": "discover" | "check" | "restart" | "metrics",   # metrics: hostprog/metrics.py's request
     "python": "/opt/venv/bin/python",        # the inventory's host.python, as written there
     "package": "sglang",
     "files": ["sglang/srt/...py", ...],      # the deployed files: their newest change is the last switch
     "health": {"url": "http://127.0.0.1:30000/health_generate", "timeout_s": 10} | null,
     # restart only:
     "url": "http://127.0.0.1:30000",         # the server's base URL (the proof's /generate, /server_info)
     "drain": {"argv": [...], "timeout_s": 120, "wait_s": 30} | null,
     "restart": {"argv": [...], "timeout_s": 300},
     "ready_timeout_s": 600, "poll_s": 2,
     "proof": {"probe": {...} | null, "probe_timeout_s": 300, "expect_algorithm": "DDTREE",
               "tree": {...}} | null,         # the launch smoke level's proof (smoke.prove_served)
     "heartbeat_s": 20}

``metrics`` scrapes the server's ``/metrics`` and ``/server_info`` (hostprog/metrics.py), with a
``load`` part under the speed gate's load step (hostprog/load.py: SGLang's benchmark drives
the server during the scrapes, then is stopped);
``discover`` answers the processes; ``check`` (``status``) adds one health GET; ``restart``
streams ``{"event": "step", "level": "drain" | "restart" | "health" | "proof"}`` and
heartbeats (``{"event": "wait", "level", "seconds"}``) and answers last with
``{"event": "done", "ok", "failed": null | STEP, "detail", "began", "drain", "restart",
"health", "proof", "before", "after"}``.

A serving process is one whose interpreter is ``python`` (its argv[0], as a supervisor or
systemd unit starts it, or the very file when ``python`` is no symlink), or whose command
line, working folder or mapped files lie under the package root; child processes of one
(SGLang's scheduler and detokenizer) are counted with it. The host programs of
ddtree-deploy themselves are not servers, nor is what they start for themselves (a smoke
probe, the launch level's or a tune's server, bench_serving: marked by ``server.OWN_ENV``),
listed apart as ``own``. The drain and restart commands run in a process group of their
own, killed and reaped whole past their timeout (``server.run_group``). Each process's start
time (``/proc/<pid>/stat`` against ``/proc/uptime``: 10 ms resolution) is compared with the
newest change (ctime) of the deployed files: a server started before it runs the code the
files held before, and must be restarted. After a restart, the server is healthy only when
the health URL answers 200 and the process listening on its port started after the restart
began.
"""


import os
import sys
import time

from ddtree_deploy.hostprog import load, server, wire
# The launch smoke level's DDTree proof, reused on the serving server: smoke's own proof, not
# its lifecycle (that is server.py's).
from ddtree_deploy.hostprog import smoke

# A process that started this little before the restart began is taken as started by it:
# /proc start times have clock-tick resolution, and the two clocks are read a moment apart.
START_SLACK_S = 0.25
ARG_CHARS = 300  # each command-line argument kept in an answer, at most
MAX_ARGS = 40
BOOTSTRAP_MARK = "ddtree_agent"  # in remote/program.py BOOTSTRAP: every host program's command line


# --------------------------------------------------------------------- processes


def _under(path, root):
    if not path or not root:
        return False
    path = os.path.normpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def match_reasons(argv, cwd, maps, python, python_real, root):
    """Why a process (its ``argv``, ``cwd``, mapped file paths) runs from the package at
    ``root`` with the interpreter ``python`` (``python_real``: its realpath, or None when the
    process's own executable is unknown); [] when it does not. Pure."""
    if not argv:
        return []
    reasons = []
    argv0 = argv[0]
    if "/" in argv0:
        full = argv0 if os.path.isabs(argv0) else os.path.join(cwd or "/", argv0)
        if os.path.normpath(full) == os.path.normpath(python):
            reasons.append("interpreter")
    if python_real is not None and "interpreter" not in reasons:
        reasons.append("interpreter")
    for i, arg in enumerate(argv[1:], 1):
        if argv[i - 1] == "-m" and (arg == "sglang" or arg.startswith("sglang.")):
            reasons.append("module")
        elif os.path.isabs(arg) and (_under(arg, root) or os.path.normpath(arg) == os.path.join(
                os.path.dirname(os.path.normpath(python)), "sglang")):
            reasons.append("script")
    if _under(cwd, root):
        reasons.append("cwd")
    if any(_under(p, root) for p in maps):
        reasons.append("maps")
    if "interpreter" in reasons or {"script", "cwd", "maps"} & set(reasons):
        return sorted(set(reasons), key=reasons.index)
    return []


def _ours(argv):
    """A host program of ddtree-deploy (the agent, smoke, tune or this one): not a server."""
    return "-c" in argv and any(BOOTSTRAP_MARK in a for a in argv)


def _read(path, limit=1 << 20):
    with open(path, "rb") as fh:
        return fh.read(limit)


def _clock():
    """(seconds since boot, clock ticks per second, the wall clock), read together."""
    uptime = float(_read("/proc/uptime").split()[0])
    return uptime, os.sysconf("SC_CLK_TCK"), time.time()


def _maps(pid):
    try:
        text = _read("/proc/%d/maps" % pid, 8 << 20).decode("utf-8", "replace")
    except OSError:
        return []
    paths = set()
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            paths.add(parts[5])
    return sorted(paths)


def _own_program(pid):
    """The host program of ddtree-deploy that started ``pid`` for itself (its OWN_ENV: a smoke
    probe, the launch level's or a tune's server, bench_serving), else None (also when its
    environment cannot be read: another user's)."""
    try:
        environ = _read("/proc/%d/environ" % pid, 1 << 20).split(b"\0")
    except OSError:
        return None
    mark = (server.OWN_ENV + "=").encode()
    for item in environ:
        if item.startswith(mark):
            return item[len(mark):].decode("utf-8", "replace")[:40] or "?"
    return None


def scan(python, root, *, exclude=()):
    """Every process on this host that runs from the package: ({pid: record}, unreadable,
    {pid: record} of those ddtree-deploy's own host programs started: never servers)."""
    uptime, hz, now = _clock()
    python_real = os.path.realpath(python)
    # The process's executable identifies it only when host.python is no symlink (then it
    # is that very file, not a venv's link to an interpreter other installs share).
    exe_counts = python_real == os.path.normpath(os.path.abspath(python))
    found, unreadable, own = {}, 0, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid in exclude:
            continue
        try:
            argv = [a.decode("utf-8", "replace") for a in _read("/proc/%d/cmdline" % pid).split(b"\0")[:-1]]
            stat = _read("/proc/%d/stat" % pid).decode("utf-8", "replace")
        except OSError:
            continue  # gone meanwhile
        fields = stat.rsplit(")", 1)[-1].split()
        if not argv or len(fields) < 20 or fields[0] == "Z" or _ours(argv):
            continue
        try:
            cwd = os.readlink("/proc/%d/cwd" % pid)
        except OSError:
            cwd = None
        real = None
        if exe_counts:
            try:
                real = python_real if os.path.realpath("/proc/%d/exe" % pid) == python_real else None
            except OSError:
                real = None
        reasons = match_reasons(argv, cwd, (), python, real, root)
        if not reasons and cwd is None:
            unreadable += 1  # another user's process: only its command line could be read
        if not reasons and os.path.basename(argv[0]).startswith(("python", "sglang")):
            # Mapped files (native modules under the package) for Python processes only:
            # reading every process's maps on each health poll would cost more than it tells.
            maps = _maps(pid)
            reasons = match_reasons(argv, cwd, maps, python, real, root) if maps else []
        if not reasons:
            continue
        started = now - (uptime - int(fields[19]) / float(hz))
        rec = {"pid": pid, "ppid": int(fields[1]), "started": round(started, 3),
               "started_iso": _iso(started), "cmdline": [a[:ARG_CHARS] for a in argv[:MAX_ARGS]],
               "cwd": cwd, "matched": reasons}
        program = _own_program(pid)
        if program is not None:
            own[pid] = dict(rec, program=program)
        else:
            found[pid] = rec
    return found, unreadable, own


def _iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + ".%02dZ" % int(t % 1 * 100)


def files_changed(root, files):
    """(newest ctime of the deployed files, that file): when the last switch replaced one."""
    newest, which = None, None
    for rel in files or ():
        if not isinstance(rel, str) or rel.startswith("/") or ".." in rel.split("/"):
            continue
        try:
            ctime = os.stat(os.path.join(root, rel)).st_ctime
        except OSError:
            continue
        if newest is None or ctime > newest:
            newest, which = ctime, rel
    return newest, which


def discover(request):
    """The serving processes (children grouped under their top process) and the last switch."""
    root = server.package_root(request.get("package") or "sglang")
    python = request["python"]
    found, unreadable, own = scan(python, root, exclude=(os.getpid(),))
    changed, which = files_changed(root, request.get("files"))
    tops = []
    for pid, rec in sorted(found.items()):
        if rec["ppid"] in found:
            continue  # a child: listed under its top process
        kids, todo = [], [pid]
        while todo:
            parent = todo.pop()
            for cpid, crec in sorted(found.items()):
                if crec["ppid"] == parent:
                    kids.append(cpid)
                    todo.append(cpid)
        rec = dict(rec, children=sorted(kids))
        rec["before_files"] = None if changed is None else rec["started"] < changed
        tops.append(rec)
    return {"package_root": root, "python": python, "files_changed": changed,
            "files_changed_iso": None if changed is None else _iso(changed), "newest_file": which,
            "processes": tops, "all_pids": sorted(found), "unreadable": unreadable,
            "own": [own[pid] for pid in sorted(own)],
            "starts": {str(pid): rec["started"] for pid, rec in found.items()}}


def listening(port, pids):
    """Which of ``pids`` listen on TCP ``port`` (this network namespace's /proc/net/tcp{,6},
    matched to the processes' socket descriptors; another user's descriptors cannot be read)."""
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = _read(name, 16 << 20).decode("ascii", "replace").splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:
                inodes.add("socket:[%s]" % f[9])
    out = []
    for pid in pids if inodes else ():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in inodes:
                    out.append(pid)
                    break
            except OSError:
                continue
    return out


# --------------------------------------------------------------------- health


def health_get(spec):
    """One GET of the health URL: its status (None: nothing answered)."""
    status, _ = server.http_request("GET", spec["url"], timeout=float(spec.get("timeout_s", 10)))
    return status


def check(request):
    """``status``: discover, and one health GET when the inventory has a [serve] table."""
    answer = discover(request)
    if request.get("health"):
        answer["health"] = {"url": request["health"]["url"], "status": health_get(request["health"])}
    return answer


# --------------------------------------------------------------------- restart


class Failed(Exception):
    def __init__(self, step, detail, **evidence):
        super().__init__(detail)
        self.step, self.detail, self.evidence = step, detail, evidence


def _command(step, spec):
    """The inventory's drain or restart argv, in a process group of its own (``run_group``):
    past its timeout the whole group is killed and reaped, and the failure says how many
    processes that was (a restart command's child left running could restart the server
    after the run, outside its lock and unrecorded)."""
    argv = list(spec["argv"])
    timeout_s = float(spec.get("timeout_s", 300))
    started = time.monotonic()
    try:
        ran = server.run_group(argv, timeout_s)
    except server.StepFailed as exc:  # the program does not exist
        raise Failed(step, "%s command: %s" % (step, exc.detail), argv=argv)
    rc, out, stopped = ran["rc"], ran["output"], ran["stopped"]
    done = {"argv": argv, "rc": rc, "seconds": round(time.monotonic() - started, 2), "output": server.tail(out, 2000)}
    if stopped is not None:
        done["killed"], done["left"] = stopped["killed"], stopped["left"]
    if rc is None:
        why = "the %s command did not finish within %g s: its process group was killed (%d process%s)" % (
            step, timeout_s, stopped["killed"], "" if stopped["killed"] == 1 else "es")
        if stopped["left"]:
            why += "; processes %s outlived TERM and KILL (another user's?)" % ", ".join(map(str, stopped["left"]))
        raise Failed(step, why, **{step: done})
    if rc != 0:
        last = out.strip().splitlines()[-1] if out.strip() else "no output"
        raise Failed(step, "the %s command exited %d: %s" % (step, rc, last[:300]), **{step: done})
    return done


def _port(url):
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def wait_healthy(request, began, before_pids=()):
    """Until the health URL answers 200 from a server started by this restart, within
    ``ready_timeout_s``: the process listening on the URL's port must have started after
    the restart began (a restart that restarted nothing leaves the old code answering).
    Where no serving process can be seen listening (another user's, a container), every
    serving process found before the restart must be gone instead."""
    port = _port(request["health"]["url"])
    timeout_s = float(request.get("ready_timeout_s", 600))
    poll_s = float(request.get("poll_s", 2))
    started = time.monotonic()
    deadline = started + timeout_s
    polls, status, old = 0, None, []
    while True:
        polls += 1
        status = health_get(request["health"])
        found = discover(request)
        listeners = listening(port, found["all_pids"])
        if listeners:
            old = [pid for pid in listeners if found["starts"][str(pid)] < began - START_SLACK_S]
        else:
            old = [pid for pid in before_pids if pid in found["all_pids"]]
        if status == 200 and not old:
            return {"url": request["health"]["url"], "status": status, "polls": polls,
                    "seconds": round(time.monotonic() - started, 2), "processes": found["processes"]}
        if time.monotonic() >= deadline:
            why = "last health status %s" % (status if status is not None else "none: nothing answered")
            if old:
                why += "; processes started before the restart still serve: %s" % ", ".join(map(str, old))
            raise Failed("health", "the server was not healthy %g s after the restart (%s)" % (timeout_s, why),
                         health={"url": request["health"]["url"], "status": status, "polls": polls,
                                 "old_left": old, "seconds": round(time.monotonic() - started, 2)})
        time.sleep(max(0.05, min(poll_s, deadline - time.monotonic())))


def restart(request, emitter=None):
    answer = {"ok": False, "failed": None, "detail": "", "drain": None, "restart": None, "health": None,
              "proof": None}

    def step(name):
        if emitter is not None:
            emitter.current, emitter.started = name, time.monotonic()
            emitter.emit({"event": "step", "level": name})

    answer["before"] = discover(request)
    answer["began"] = time.time()
    try:
        drain = request.get("drain")
        if drain:
            step("drain")
            answer["drain"] = _command("drain", drain)
            time.sleep(float(drain.get("wait_s", 0)))
        step("restart")
        answer["began"] = time.time()
        answer["restart"] = _command("restart", request["restart"])
        step("health")
        answer["health"] = wait_healthy(request, answer["began"], answer["before"]["all_pids"])
        if request.get("proof"):
            step("proof")
            evidence = {}
            try:
                smoke.prove_served(request["proof"], request["url"], evidence)
            except server.StepFailed as exc:
                raise Failed("proof", exc.detail, proof=dict(evidence, **exc.evidence))
            answer["proof"] = evidence
        answer["ok"] = True
        answer["detail"] = _healthy_line(answer)
    except Failed as exc:
        answer.update(failed=exc.step, detail=exc.detail, **exc.evidence)
    finally:
        if emitter is not None:
            emitter.current = None
    answer["after"] = discover(request)
    return answer


def _healthy_line(answer):
    health = answer["health"]
    pids = ", ".join(str(p["pid"]) for p in health.get("processes") or ()) or "none found"
    line = "healthy %.1f s after the restart (pid %s)" % (health["seconds"] + answer["restart"]["seconds"], pids)
    tree = (answer.get("proof") or {}).get("tree")
    return line + "; " + smoke.tree_line(tree) if tree else line


# --------------------------------------------------------------------- the restart's own record


def end_record(request, answer, seconds):
    """The journal's record of how the restart ended (serve_run.Restart.record's fields)."""
    proof = request.get("proof")
    spec = request.get("record") or {}
    return {"state": "healthy" if answer.get("ok") else "unhealthy", "run_id": spec.get("run_id"),
            "restart_run": spec.get("restart_run"), "time": wire.now_iso(), "failed": answer.get("failed"),
            "detail": str(answer.get("detail") or "")[:500],
            "proof": None if not proof else ("tree" if proof.get("probe") is not None else "width"),
            "pids": [p["pid"] for p in (answer.get("after") or {}).get("processes") or ()],
            "seconds": round(seconds, 2)}


def record_end(request, answer, seconds):
    """Record the restart's end in the host's journal and history ourselves (``record``: the
    state folder and the runs), so that it never stays ``restarting`` when the controller
    that began it is gone: compare-and-set (Journal.record_restart_end), so a controller that
    is still there finds it recorded and says it once. -> True (written here), False
    (nothing to write), or why it could not be (a state folder this user cannot write: the
    controller records it then)."""
    spec = request.get("record")
    if not isinstance(spec, dict) or not spec.get("state_dir"):
        return False
    try:
        from ddtree_deploy.hostprog.agent import Agent

        agent = Agent(spec["state_dir"])
        agent.package.root = server.package_root(request.get("package") or "sglang")
        agent.folder.need_state_dir()
        if not os.path.isfile(agent.folder.path("journal.json")):
            return False
        return agent.journal.record_restart_end(end_record(request, answer, seconds), holder=spec.get("holder"),
                                                command=spec.get("command"))
    except Exception as exc:  # noqa: BLE001 - the record is evidence: it never fails the restart
        return "not recorded here: %s: %s" % (type(exc).__name__, exc)


# --------------------------------------------------------------------- main

OPS = {"discover": discover, "check": check}
LONG_OPS = {"restart": restart, "metrics": load.scrape}  # these beat while they wait (metrics: load.py)


def _check(request):
    op = request["op"]
    if op not in OPS and op not in LONG_OPS:
        raise KeyError("unknown op %r" % (op,))
    str(request["python"])
    return None


def main(argv=None):
    """Read one request line (stdin, or the file named by the only argument); answer JSON lines.

    A dropped connection must not stop a restart half-way: hangups and broken pipes are
    ignored, every wait has its deadline, and the answer is dropped when nobody reads it.
    """
    request = wire.one_request(argv, _check)
    if request is None:
        return 2
    op = request["op"]
    emitter = wire.Emitter(sys.stdout.buffer, float(request.get("heartbeat_s", wire.HEARTBEAT_S)))
    started = time.monotonic()
    try:
        try:
            answer = LONG_OPS[op](request, emitter) if op in LONG_OPS else dict(OPS[op](request), ok=True)
            if op == "restart":
                answer["recorded"] = record_end(request, answer, time.monotonic() - started)
        except server.StepFailed as exc:  # no sglang package for this interpreter
            answer = {"ok": False, "error": exc.detail}
        except Exception as exc:  # a bug must still answer JSON, not a traceback
            answer = {"ok": False, "error": "%s: %s" % (type(exc).__name__, exc)}
        emitter.emit(dict(answer, event="done"))
    finally:
        emitter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
