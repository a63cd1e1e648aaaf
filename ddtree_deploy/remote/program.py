"""The program session: ship a stdlib host program to a host and talk to it in typed messages.

``ProgramSession`` is the one way to start a host program (the deploy agent, the smoke,
serve, tune and container programs: a ``HostProgram``): shipped whole, with the modules it
imports (``hostprog.bundle``), over a transport to the host's interpreter
(``python -c BOOTSTRAP``), then JSON lines both ways, each received line parsed once into
the message it is (``hostprog/protocol.py``). A request-answering program's requests are
checked against their declaration before they are sent, and the first exchange carries both
sides' protocol versions (docs/protocol.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import Changed, DeployError
from ddtree_deploy.hostprog import bundle, protocol
from ddtree_deploy.remote import inflight
from ddtree_deploy.remote.link import Process, ReplyError, Transport
from ddtree_deploy.remote.link_errors import link_lost
from ddtree_deploy.settings.inventory import Host

# Any host program, not only the agent: read one line (the source's length in bytes), then
# that many bytes of source (the program bundled with the modules it imports: bundle.py),
# compile and run it in memory under the module name ``ddtree_agent`` (the word by which
# hostprog/serve.py's BOOTSTRAP_MARK tells our programs' command lines), then call the
# ``main`` it defines, whose loop reads the JSON requests that follow on the same stdin. Nothing is written on the host
# to start it: no file, no bytecode of the program. Short, fixed, and free of any
# inventory value: the interpreter path is the only thing that varies, and an SSH
# transport quotes every word of the argv (remote/ssh.py remote_command: shlex.join).
BOOTSTRAP = (
    "import sys;b=sys.stdin.buffer;g={'__name__':'ddtree_agent'};"
    "exec(compile(b.read(int(b.readline())),'ddtree_agent.py','exec'),g);g['main']()"
)
#: Seconds a failed write waits for the program's exit status (it is there already when the
#: program ended: the status comes before the channel's close).
EXIT_STATUS_WAIT_S = 2.0


class ProtocolMismatch(DeployError):
    """The host program and this controller speak different protocol versions (or the program
    broke the protocol): nothing was acted on, the session is closed."""

    code = Code.PROTOCOL


def program_argv(host: Host, *, sudo: bool = False) -> list[str]:
    """The command that runs a shipped host program on ``host`` (pure; tested by equality)."""
    prefix = ["sudo", "-n", "--"] if sudo else []
    return [*prefix, host.python, "-c", BOOTSTRAP]


def agent_argv(host: Host) -> list[str]:
    """The deploy agent's command: under ``sudo -n`` when the inventory says so."""
    return program_argv(host, sudo=host.sudo)


@dataclass(frozen=True)
class HostProgram:
    """A stdlib-only Python program (``module``, in ddtree_deploy/hostprog/) shipped whole to
    a host, with every module it imports (``hostprog.bundle``), and run there.

    ``code`` is the error code of its failures; ``stopped_code`` / ``stopped_hint`` those of
    a program that ended without answering.
    """

    module: str
    name: str
    code: str
    stopped_code: str | None = None
    stopped_hint: str | None = None
    #: What a lost link leaves on the host once the program runs (ProgramSession.lost_state).
    lost_state: str = "the host program ends on its own and stops what it started"
    #: Its ops' declaration in hostprog/protocol.py (``PROGRAMS``): requests are checked against
    #: it before they are sent, and its first exchange carries both protocol versions. None: a
    #: program of events (smoke, serve, tune), its request its own.
    ops: str | None = None

    def source(self) -> bytes:
        return bundle.source(self.module)


AGENT = HostProgram("ddtree_deploy.hostprog.agent", "the agent", Code.AGENT, stopped_code=Code.CONNECTION_LOST,
                    stopped_hint=f"run {next_step.status()} to see where the host stands, then rerun", ops="agent")


#: A [container] host's program (hostprog/container.py): the engine CLI on the host, and the
#: lock, journal and history of the container (containers/session.py runs it).
CONTAINER_PROGRAM = HostProgram(
    "ddtree_deploy.hostprog.container", "the container program", Code.CONTAINER_AGENT,
    stopped_code=Code.CONNECTION_LOST, stopped_hint=f"run {next_step.status()} to see where the host stands",
    lost_state="the container program goes on alone: it completes the step it was given (the journal says how "
    "far) and releases the deploy lock", ops="container")


def agent_source() -> bytes:
    return AGENT.source()


class ProgramSession:
    """One host program on one host, started over ``transport`` (which the caller opens).

    ``__enter__`` starts ``python -c BOOTSTRAP`` (under ``sudo -n`` only when ``sudo``) and
    uploads the program; ``send`` writes JSON lines, ``read`` reads one JSON line within a
    deadline. A program that ends without a line is one error naming the step, its exit
    code and its last stderr line; one whose interpreter cannot even start (exit 126/127
    before any reply) says which ``host.python`` to fix.
    """

    def __init__(self, transport: Transport, host: Host, program: HostProgram, *, sudo: bool = False,
                 label: str | None = None):
        self.transport, self.host, self.program, self.sudo = transport, host, program, sudo
        self.label = label or host.name
        self.proc: Process | None = None
        self.received = 0  # lines read so far: none means the program may never have started
        self.uploaded = False  # the program's source was handed to the link whole
        self.waiting_for: str | None = None  # what the current read waits for (messages)
        self.hello_pending = False  # an init was sent, its answer (the program's version) not read yet
        # (phase, seconds) as they happened: the program's start (channel + upload), then the
        # round trips a session records (AgentSession: one per call, named by its ops).
        self.timings: list[tuple[str, float]] = []
        self._wait: int | None = None  # its registration with inflight (Ctrl-C's line, link dropped)

    def __enter__(self):
        inflight.check(self.label)
        t0 = time.monotonic()
        self.proc = self.transport.start(program_argv(self.host, sudo=self.sudo))
        self._wait = inflight.enter(self.label, self.interrupted_state, self.detach)
        try:
            source = self.program.source()
            self.write(b"%d\n" % len(source) + source, f"while uploading {self.program.name}")
            self.uploaded = True
            self.timings.append((f"{self.program.name.removeprefix('the ')} start", time.monotonic() - t0))
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return self

    def __exit__(self, *exc):
        if self._wait is not None:
            # Ctrl-C in this thread: its line is noted and the link dropped (detach), so the
            # close below never waits on a silent host for the exit status.
            inflight.leave(self._wait, interrupted=len(exc) > 1 and isinstance(exc[1], KeyboardInterrupt))
            self._wait = None
        if self.proc is not None:
            self.proc.close()
            self.proc = None

    def interrupted_state(self) -> str:
        """Ctrl-C's line for this session: what it waited for, what that leaves, what to run."""
        during = f"waiting for {self.waiting_for}" if self.waiting_for else "between two requests"
        return (f"interrupted {during}: {self.lost_state()}; {next_step.status(self.host.name)} shows where the "
                "host stands")

    def write(self, data: bytes, during: str) -> None:
        """Write raw bytes; a lost connection says what was being sent (``during``)."""
        if self.proc is None:
            raise DeployError(f"{self.label}: {self.program.name} is not running", code=Code.CONNECTION_LOST)
        inflight.check(self.label)  # after Ctrl-C a woken worker sends nothing more
        try:
            self.proc.write(data)
        except DeployError as exc:
            if exc.code == Code.CONNECTION_LOST:
                # The interpreter may not even have started: the shell's exit 127 closes the
                # channel while the upload is still being written, and the write loses that race.
                raise self._no_interpreter() or self._lost_during(exc, during) from None
            raise

    def _lost_during(self, exc: DeployError, during: str) -> DeployError:
        """The link's loss (``exc``: its cause in words) said with what was under way and
        what that leaves on the host, which only this session knows."""
        return link_lost(self.label, str(exc.evidence.get("why") or "the connection was closed"), during,
                         state=self.lost_state(), changed=self.lost_changed())

    def _no_interpreter(self) -> DeployError | None:
        """The host's Python could not be run (the shell's exit 126/127 before any reply),
        when that is why the link closed; else None. Waits briefly for the exit status:
        OpenSSH sends it before it closes the channel, so a closed channel already has it."""
        if self.received or self.proc is None:
            return None
        ended = self.proc.ended(EXIT_STATUS_WAIT_S)
        if ended is None or ended[0] not in (126, 127):
            return None
        return self._python_error(*ended)

    def _python_error(self, code: int, tail: str) -> DeployError:
        """The shell could not run the interpreter (exit 126/127): nothing ran on the host."""
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        return DeployError(
            f"{self.label}: cannot run the host's Python {self.host.python!r} (exit {code}; {detail})",
            code=Code.AGENT, hint=f"set host.python in {self.host.source or 'the inventory'} to an interpreter "
            "on the host that has sglang installed (`command -v python3` there shows one)")

    def send(self, *docs: dict, during: str = "while sending a request") -> None:
        """JSON lines, in one write. A request-answering program's requests are checked against
        its declaration first (a request that breaks it is this controller's bug: nothing is
        sent), and an ``init`` carries this controller's protocol version (the first exchange)."""
        if self.program.ops is not None:
            docs = tuple(self._request(d) for d in docs)
        self.write(b"".join(json.dumps(d).encode() + b"\n" for d in docs), during)

    def _request(self, doc: dict) -> protocol.Request:
        if doc.get("op") == "init":
            doc = {"protocol": protocol.PROTOCOL, **doc}
            self.hello_pending = True
        try:
            return protocol.check_request(self.program.ops, doc)
        except protocol.ProtocolError as exc:
            raise DeployError(f"{self.label}: this ddtree-deploy built a request that breaks the protocol: {exc}",
                              code=Code.INTERNAL, hint="report it as a bug; nothing was sent to the host") from None

    def read(self, deadline: float | None = None, what: str = "a reply",
             during: str | None = None) -> protocol.Reply | protocol.Event:
        """One JSON line, parsed once into the message it is (hostprog/protocol.py), read
        ``during`` a step (``what``, ``during``: both for messages). The answer to an ``init``
        must name this controller's protocol version: else ProtocolMismatch, session closed.
        ``deadline`` (time.monotonic): TimeoutError past it (the caller words it, it knows
        the step's limit); ReplyError for an oversized line."""
        if self.proc is None:
            raise DeployError(f"{self.label}: {self.program.name} is not running", code=Code.CONNECTION_LOST)
        during = during or what
        self.waiting_for = during
        try:
            line = self.proc.readline(deadline, what)
        except DeployError as exc:
            if exc.code == Code.CONNECTION_LOST and not isinstance(exc, ReplyError):
                raise self._no_interpreter() or self._lost_during(exc, f"waiting for {during}") from None
            raise
        if not line.endswith(b"\n"):
            raise self._stopped(during)
        self.waiting_for = None
        self.received += 1
        try:
            message = protocol.parse_line(json.loads(line))
        except (ValueError, RecursionError):  # RecursionError: nested past what json.loads can recurse
            raise DeployError(f"{self.label}: {self.program.name} answered garbage: {line[:200]!r}",
                              code=self.program.code) from None
        if self.hello_pending and isinstance(message, protocol.Reply):
            self.hello_pending = False  # the program answers in order: this is the init's answer
            mismatch = protocol.hello_mismatch(message)
            if mismatch is not None:
                self.abort()  # the program sees EOF: it releases what a pipelined lock took
                raise ProtocolMismatch(
                    f"{self.label}: {mismatch}; nothing was changed on the host",
                    hint="run both sides from one ddtree-deploy release: a push ships its own host programs, so "
                    "an older one comes from a wrapper or an image built by another release (rebuild it), "
                    "or this controller is the older one (install the newer one here: `pipx install --force .` in its "
                    "checkout)")
        return message

    def _stopped(self, during: str) -> DeployError:
        proc, self.proc = self.proc, None
        code, tail = proc.close() if proc is not None else (None, "")  # None: dropped by a Ctrl-C meanwhile
        detail = tail.strip().splitlines()[-1] if tail.strip() else "no output"
        if code in (None, -1) and not tail.strip():
            # No exit status at all: the program did not stop, the link did (paramiko's -1
            # is "the channel closed without one").
            return DeployError(f"{self.label}: connection lost waiting for {during} (the link closed without an "
                               f"exit status from the host); {self.lost_state()}",
                               code=Code.CONNECTION_LOST, changed=self.lost_changed(),
                               hint=f"run {next_step.status(self.host.name)} to see "
                               "where the host stands, then rerun")
        if self.received == 0 and code in (126, 127):
            return self._python_error(code, tail)
        return DeployError(f"{self.label}: {self.program.name} stopped during {during} (exit {code}; {detail}); "
                           f"{self.lost_state()}",
                           code=self.program.stopped_code or self.program.code, hint=self.program.stopped_hint)

    def lost_state(self) -> str:
        """What a link lost (or a program stopped) now leaves on the host, in words."""
        if not self.uploaded:
            return f"{self.program.name} never started: nothing on the host changed"
        return self.program.lost_state

    def lost_changed(self) -> Changed:
        """``lost_state`` as the error's ``changed``: a program that never started changed
        nothing; one that runs on alone may."""
        return Changed.NO if not self.uploaded else Changed.MAYBE

    def abort(self) -> None:
        """Stop waiting now: kill a local program, close an SSH channel."""
        if self.proc is not None:
            self.proc.abort()
            self.proc = None

    def detach(self) -> None:
        """Stop listening, leave the program running to finish on its own (it ignores the
        hangup, and every wait of its own has a deadline: the smoke program then stops
        the server it started)."""
        if self.proc is not None:
            self.proc.detach()
            self.proc = None


__all__ = ["AGENT", "BOOTSTRAP", "CONTAINER_PROGRAM", "HostProgram", "ProgramSession", "ProtocolMismatch",
           "agent_argv", "agent_source", "program_argv"]
