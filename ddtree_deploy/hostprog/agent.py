"""The deploy agent: a stdlib-only program that runs ON the host, with the host's interpreter.

It is shipped once per command (the transport runs ``python -c BOOTSTRAP`` and sends this
program with the modules it imports: bundle.py), then JSON requests on stdin, and answers
one JSON line per request on stdout. One process serves the whole command, so a push is
two round trips however many files it touches: (init, lock, facts) pipelined, then
(apply, unlock).

Why a program and not shell commands: the host-side steps (lock, back up, stage,
switch, journal) must finish even when the connection drops half-way, and no value
from a patch, an inventory or a path may reach a shell. Here every path travels as
JSON and is used through os.* calls only.

This module is the dispatch only; each job is a part of its own (a module, one class
each), made with the parts it uses, that ``Agent`` builds in that order: ``facts``'s
PackageRoot (the package root and its files), ``state`` (the state folder, its layout and
the check that it is ours; ``roots``: which folder of it holds this install's state),
``lock``'s HeldLock (this run's hold), ``history``, ``lock`` (the deploy lock and its
fencing), ``facts`` (read-only: SGLang, file digests, backups), ``journal`` and ``apply``
(keep drifted files, back up, stage, switch). The
agent's error and careful file writes are ``fileops``; JSON lines, digests and the test
hooks are ``wire``'s.
"""

import os
import signal
import socket
import sys

from ddtree_deploy.base.codes import Code
from ddtree_deploy.hostprog import protocol, wire
from ddtree_deploy.hostprog.apply import Apply
from ddtree_deploy.hostprog.facts import Facts, PackageRoot
from ddtree_deploy.hostprog.fileops import AgentError, describe_os_error
from ddtree_deploy.hostprog.history import History
from ddtree_deploy.hostprog.journal import Journal
from ddtree_deploy.hostprog.lock import GUARD_WAIT_S, HeldLock, Lock
from ddtree_deploy.hostprog.state import StateFolder

# Each request's "op" -> the part that answers it and its method (``agent``: Agent itself).
OPS = {
    "init": ("agent", "op_init"),
    "lock": ("lock", "op_lock"), "unlock": ("lock", "op_unlock"), "lock_status": ("lock", "op_lock_status"),
    "lock_release": ("lock", "op_lock_release"),
    "facts": ("facts", "op_facts"), "driver": ("facts", "op_driver"),
    "apply": ("apply", "op_apply"),
    "mark": ("journal", "op_mark"), "served": ("journal", "op_served"), "speed": ("history", "op_speed"),
    "history": ("history", "op_history"), "switches": ("history", "op_switches"),
}


class Agent(object):
    """One agent process: its parts, built in the order they use each other (each is given
    the parts it uses, below it), and the op dispatch. The parts hold the state of the jobs
    for its command: the package root, the state folder, the lock it took, the journal it
    last wrote."""

    def __init__(self, state_dir=None, hooks=None):
        self.hooks = wire.Hooks(hooks)
        self.package = PackageRoot()
        self.folder = StateFolder(self.package)
        self.held = HeldLock()
        self.history = History(self.folder, self.package, self.held)
        self.lock = Lock(self.folder, self.package, self.held, self.history, self.folder.list_backups)
        self.facts = Facts(self.folder, self.package, self.lock)
        self.journal = Journal(self.folder, self.held, self.lock, self.history)
        self.apply = Apply(self.folder, self.package, self.held, self.lock, self.journal, self.history, self.hooks)
        if state_dir:
            self.folder.set_state_dir(state_dir)

    def handle(self, request):
        op = request.get("op")
        part, method = OPS.get(str(op), (None, None))
        fn = getattr(self if part == "agent" else getattr(self, part), method) if part else None
        if fn is None:
            return {"ok": False, "code": Code.PROTOCOL, "message": "unknown op %r" % (op,)}
        try:
            result = fn(request)
        except AgentError as exc:
            out = {"ok": False, "code": exc.code, "message": exc.message}
            out.update(exc.extra)
            return out
        except OSError as exc:
            # The controller names the step (``<host>: <step>: <this>``): the file and the
            # reason only.
            out = {"ok": False, "code": Code.OS_ERROR, "message": describe_os_error(exc)}
            if getattr(exc, "history_warning", None):
                out["history_warning"] = exc.history_warning
            return out
        result["ok"] = True
        return result

    def op_init(self, request):
        self.folder.set_state_dir(request.get("state_dir") or "~/.ddtree-deploy")
        if request.get("guard_wait_s"):  # the controller's read deadline is shorter than lock.GUARD_WAIT_S
            self.lock.guard_wait_s = max(0.1, min(float(request["guard_wait_s"]), GUARD_WAIT_S))
        return {
            "protocol": protocol.PROTOCOL,
            "python": "%d.%d.%d" % sys.version_info[:3],
            "executable": sys.executable,
            "state_dir": self.folder.state_dir,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }


def serve(stdin, stdout, hooks=None):
    """Answer one JSON line per request line until EOF; always release the lock at the end."""
    agent = Agent(hooks=hooks)
    try:
        wire.answer_lines(stdin, wire.Emitter(stdout), agent.hooks, agent.handle, "agent")
    finally:
        agent.lock.release()


def main():
    # A dropped SSH connection must not stop a switch half-way: ignore hangups, and treat
    # a closed stdout as "stop talking" (wire.Emitter), never as "stop working". Ctrl-C at
    # a terminal reaches a local agent too (same process group): the controller decides,
    # and lets go of the link; the agent finishes the request it has, then sees EOF.
    wire.keep_working(signal.SIGINT)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
