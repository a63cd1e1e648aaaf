"""The container program: a stdlib-only program that runs ON a container host, with the host's
own interpreter (``host.python``: no sglang needed outside the container), and drives the
engine's CLI (docker or podman, argv lists from ``engine_cli``, never a shell).

One process serves the whole command, like the deploy agent: JSON requests on stdin, one
answer line each (and, during a long step, heartbeats ``{"event": "wait", ...}``). Its state
lives on the host, outside the container, in the state folder, keyed by the container where
a venv install is keyed by its package root (roots.py; the key of ``/container:ENGINE/NAME``):
the deploy lock and its fencing (lock.py), the history (history.py) and its own journal.

Ops (each answer ``{"ok": true, ...}`` or ``{"ok": false, "code", "message"}``):

    init      state folder, container, engine: is the engine installed, does it answer
    inspect   read-only: the container, its image, the sglang inside, the journal, the lock; with
              ``driver``, the host's NVIDIA driver (nvidia-smi on the host, outside the container)
    lock / unlock, lock_status / lock_release, history (lock.py's and history.py's own ops)
    build     under the lock: tag the base image (kept: rollback runs it), build the new image
              from the build context sent (``ddtree-deploy image``'s, FROM that tag)
    switch    stop the container, rename it aside, create one of the same name from its run
              configuration with the new image, start it (journal ``switching`` then ``switched``;
              a failure puts the old container back before it answers)
    verify    the switched container runs, its health URL answers 200, the DDTree proof
    keep      the switch stands: remove the container kept aside (journal ``deployed`` / ``rolled-back``)
    restore   undo a switch: the container kept aside back under its name (or, when it is gone,
              one created from the recorded configuration with the old image), started

A dropped connection never stops a step half-way: hangups are ignored, the step in hand is
finished, then the end of the input releases the lock. The journal says how far a run got;
``status`` explains it and ``push`` or ``rollback`` run again finish it.
"""

import base64
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.hostprog import engine_cli as cli
from ddtree_deploy.hostprog import gpu_driver
from ddtree_deploy.hostprog import server
# The launch smoke level's DDTree proof, reused on the switched container: smoke's own proof,
# not its lifecycle (that is server.py's).
from ddtree_deploy.hostprog import smoke
from ddtree_deploy.hostprog import protocol, wire
from ddtree_deploy.hostprog.fileops import AgentError, describe_os_error, makedirs_private, write_json_atomic
from ddtree_deploy.hostprog.facts import PackageRoot
from ddtree_deploy.hostprog.history import History
from ddtree_deploy.hostprog.lock import GUARD_WAIT_S, HeldLock, Lock
from ddtree_deploy.hostprog.state import StateFolder

PROBE_S = 60.0  # an engine probe, inspect, tag, rename, rm: at most
OUTPUT_CAP = 1 << 20

# Run by the container's own interpreter: where sglang is, its version, the sha256 of the
# files named as arguments (package-relative). Finds sglang without importing it.
PROBE = r"""
import hashlib, importlib.util, json, os, sys
out = {"python": sys.executable, "sglang": None}
spec = importlib.util.find_spec("sglang")
if spec is not None and spec.origin:
    root = os.path.dirname(os.path.dirname(spec.origin))
    version = None
    try:
        from importlib import metadata
        version = metadata.version("sglang")
    except Exception:
        pass
    files = {}
    for rel in sys.argv[1:]:
        if rel.startswith("/") or ".." in rel.split("/"):
            continue
        path = os.path.join(root, rel)
        if os.path.isfile(path) and not os.path.islink(path):
            with open(path, "rb") as fh:
                files[rel] = hashlib.sha256(fh.read()).hexdigest()
        else:
            files[rel] = None
    out["sglang"] = {"package_root": root, "version": version, "files": files}
print(json.dumps(out))
"""


def run(argv, timeout_s=PROBE_S, ok=True):
    """Run an engine command (its own process group, stopped whole past ``timeout_s``):
    {"rc", "out", "err"}; with ``ok``, a failure is AgentError(ENGINE_FAILED) naming the
    command and its last line of output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True,
                                    close_fds=True)
        except OSError as exc:
            raise AgentError(Code.NO_ENGINE, "cannot run %s: %s" % (argv[0], exc.strerror))
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            server.stop_group(proc, 5.0)
            rc = None
        texts = []
        for f in (out, err):
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - OUTPUT_CAP))
            texts.append(f.read().decode("utf-8", "replace"))
    done = {"rc": rc, "out": texts[0], "err": texts[1]}
    if ok and rc != 0:
        raise AgentError(Code.ENGINE_FAILED, "`%s` %s" % (_shown(argv), _why(done, timeout_s)))
    return done


def _shown(argv):
    """An engine command as a message shows it: its first words (a build context's paths, a
    probe's code are long)."""
    words = [os.path.basename(argv[0])] + [a if len(a) < 60 else a[:40] + "..." for a in argv[1:6]]
    return " ".join(words) + (" ..." if len(argv) > 6 else "")


def _why(done, timeout_s):
    if done["rc"] is None:
        return "did not finish within %g s (its process group was stopped)" % timeout_s
    lines = (done["err"].strip() or done["out"].strip()).splitlines()
    return "exited %s: %s" % (done["rc"], lines[-1][:300] if lines else "no output")


class ContainerIdentity(PackageRoot):
    """The container program's "package root": the container's key, set by init
    (ContainerSettings.identity), which names its state's folder (roots.py) and its lines in
    the history; a container host has no package files of its own."""

    def target(self, rel):
        raise AgentError(Code.BAD_PATH, "a container host has no package files of its own: %s" % rel)


class Containers(object):
    """One container program: the state folder of one container, its lock, its history (the
    agent's parts, built the same way), the engine."""

    def __init__(self, emitter):
        self.emitter = emitter
        self.hooks = wire.Hooks(None)
        self.package = ContainerIdentity()
        # An earlier layout's state is a venv install's, never a container's.
        self.folder = StateFolder(self.package, adopt_legacy=False)
        self.held = HeldLock()
        self.history = History(self.folder, self.package, self.held)
        # A container keeps images, not file backups: the lock's sweep has none to read.
        self.lock = Lock(self.folder, self.package, self.held, self.history, lambda kind="backups": [])
        self.c = None  # the init request's container table
        self.engine = None  # the engine CLI's path

    # -- the ops

    def op_init(self, request):
        c = request["container"]
        if c.get("engine") not in cli.ENGINES or not c.get("name"):
            raise AgentError(Code.PROTOCOL, "init needs container.engine and container.name")
        self.c = c
        self.package.root = "/container:%s/%s" % (c["engine"], c["name"])  # ContainerSettings.identity
        self.folder.set_state_dir(request.get("state_dir") or "~/.ddtree-deploy")
        if request.get("guard_wait_s"):
            self.lock.guard_wait_s = max(0.1, min(float(request["guard_wait_s"]), GUARD_WAIT_S))
        path = shutil.which(c["engine"])
        if path is None:
            raise AgentError(Code.NO_ENGINE, "%s is not installed on %s (not on PATH: %s)"
                             % (c["engine"], socket.gethostname(), os.environ.get("PATH", "")))
        done = run(cli.probe_argv(path, c["engine"]), ok=False)
        if done["rc"] != 0:
            raise AgentError(Code.ENGINE_DOWN, "%s is installed (%s) but does not answer: %s"
                             % (c["engine"], path, _why(done, PROBE_S)))
        self.engine = path
        return {"protocol": protocol.PROTOCOL, "engine": path, "host": socket.gethostname(),
                "python": "%d.%d.%d" % sys.version_info[:3],
                "state_dir": self.folder.state_dir, "pid": os.getpid()}

    def _need(self):
        if self.engine is None:
            raise AgentError(Code.PROTOCOL, "init must run first")

    def inspect_one(self, what, ref):
        """The engine's inspect document of ``ref`` (None: there is none)."""
        done = run(cli.inspect_argv(self.engine, what, ref), ok=False)
        if done["rc"] != 0:
            return None
        try:
            doc = json.loads(done["out"])
        except ValueError:
            raise AgentError(Code.ENGINE_FAILED, "%s inspect %s answered no JSON" % (what, ref))
        return doc[0] if isinstance(doc, list) and doc else None

    def names(self):
        done = run(cli.list_names_argv(self.engine))
        return sorted({n.strip() for line in done["out"].splitlines() for n in line.split(",") if n.strip()})

    def container(self, name=None):
        """The container ``name`` (default: ours) as {id, name, image, image_ref, state, ...}, or None."""
        name = name or self.c["name"]
        if name not in self.names():
            return None
        doc = self.inspect_one("container", name)
        return None if doc is None else _summary(doc)

    def probe(self, summary, paths):
        """The sglang inside: exec'd into a running container, else in a throwaway one of its image."""
        python = self.c.get("python") or "python3"
        if summary["running"]:
            argv = cli.exec_argv(self.engine, summary["id"], python, PROBE, paths)
        else:
            argv = cli.run_probe_argv(self.engine, summary["image"], python, PROBE, paths)
        done = run(argv, timeout_s=120.0, ok=False)
        if done["rc"] != 0:
            return {"error": "%s in the container: %s" % (python, _why(done, 120.0)), "sglang": None}
        try:
            return json.loads(done["out"].strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": "%s in the container answered no JSON" % python, "sglang": None}

    def op_inspect(self, request):
        """Read-only: the container, its image, the sglang inside, and this container's state;
        asked (``driver``), the host's NVIDIA driver as the host's own nvidia-smi says it."""
        self._need()
        self.folder.need_state_dir()
        found = self.container()
        out = {"container": found, "image": None, "probe": None, "aside": self.container(cli.aside_name(self.c["name"])),
               "journal": None, "lock": None, "names": None, "kept": {}, "health": None}
        if found is None:
            out["names"] = self.names()
        else:
            doc = self.inspect_one("image", found["image"])
            out["image"] = _image_summary(doc) if doc else None
            out["probe"] = self.probe(found, request.get("paths") or [])
            if request.get("health_url") and found["running"]:
                status, _ = server.http_request("GET", request["health_url"], timeout=10.0)
                out["health"] = {"url": request["health_url"], "status": status}
        if request.get("driver"):  # the HOST's driver (this program runs on the host, not in the container)
            out["driver"] = gpu_driver.probe()
        if os.path.isdir(self.folder.state_dir):
            out["journal"] = self.read_journal()
            out["lock"] = self.lock.read_lock()
            for key in ("image", "previous"):
                ref = (out["journal"] or {}).get(key) or {}
                if ref.get("id"):
                    out["kept"][ref["id"]] = self.inspect_one("image", ref["id"]) is not None
        return out

    # -- the journal (this container's; written under the lock only)

    def read_journal(self):
        doc = wire.read_json(self.folder.path("journal.json"))
        return doc if isinstance(doc, dict) and doc.get("kind") == "container" else None

    def write_journal(self, journal, phase):
        journal = dict(journal, phase=phase, updated=wire.now_iso(), version=1, kind="container",
                       package_root=self.package.root, engine=self.c["engine"], container=self.c["name"])
        with self.lock.fenced("the journal write (phase %s)" % phase):
            write_json_atomic(self.folder.path("journal.json"), journal)
        return journal

    def _locked(self, op):
        if not self.held.locked:
            raise AgentError(Code.PROTOCOL, "%s needs the deploy lock" % op)

    # -- build

    def op_build(self, request):
        """Tag the base image (kept: rollback runs it; the context's Dockerfile is FROM that tag),
        write the build context sent, build it; the new image."""
        self._locked("build")
        base_id, kept = request["base"], request["kept_tag"]
        with self.lock.fenced("tagging the base image"):
            run(cli.tag_argv(self.engine, base_id, kept))
        folder = self.folder.path("build", request["run_id"])
        shutil.rmtree(folder, ignore_errors=True)
        try:
            for rel, data in sorted(request["files"].items()):
                if rel.startswith("/") or ".." in rel.split("/"):
                    raise AgentError(Code.BAD_PATH, "build context path %r is not relative" % rel)
                path = os.path.join(folder, rel)
                makedirs_private(os.path.dirname(path))
                with open(path, "wb") as fh:
                    fh.write(base64.b64decode(data))
            tag = request["tag"]
            self.emitter.current = "build"
            with self.lock.fenced("building the image"):
                done = run(cli.build_argv(self.engine, folder, tag), timeout_s=float(request.get("timeout_s") or 1800),
                           ok=False)
            if done["rc"] != 0:
                tail = (done["out"] + done["err"]).strip().splitlines()
                said = [line for line in tail if "ddtree-deploy image: error:" in line]
                raise AgentError(Code.ENGINE_FAILED, "the image build failed: %s"
                                 % (said[-1].split("error:", 1)[1].strip() if said else _why(done, 1800)),
                                 output=server.tail(done["out"] + done["err"], 4000))
        finally:
            self.emitter.current = None
            shutil.rmtree(folder, ignore_errors=True)
        image = _image_summary(self.inspect_one("image", tag))
        self.history.record("build", outcome="ok", container=self.c["name"], base={"id": base_id, "tag": kept},
                            image={"id": image["id"], "tag": tag}, series=request.get("series"),
                            series_id=request.get("series_id"))
        return {"image": image, "kept_tag": kept, "tag": tag}

    # -- switch, verify, keep, restore

    def op_switch(self, request):
        """Stop the container, rename it aside, create its twin with ``image``, start it."""
        self._locked("switch")
        name, aside = self.c["name"], cli.aside_name(self.c["name"])
        current = self.inspect_one("container", name)
        if current is None or current["Id"] != request["expect"]:
            raise AgentError(Code.CHANGED, "container %s is no longer %s (it was recreated meanwhile): nothing was "
                             "changed" % (name, request["expect"][:12]))
        if aside in self.names():
            raise AgentError(Code.CHANGED, "a container named %s exists (an earlier switch kept it aside): run "
                             "rollback to put it back, or remove it, first; nothing was changed" % aside)
        image_doc = self.inspect_one("image", current["Image"])
        config = cli.run_config(current, image_doc or {})
        makedirs_private(self.folder.path("containers"))
        kept = self.folder.path("containers", request["run_id"] + ".json")
        with self.lock.fenced("keeping the container's inspect document"):
            write_json_atomic(kept, current)
        before = self.read_journal() or {}
        to = request["image"]
        journal = dict(before, run_id=request["run_id"], command=request.get("command"),
                       switch={"kind": request.get("kind") or "push", "from_image": current["Image"],
                               "from_tag": request.get("from_tag"), "to_image": to["id"], "to_tag": to.get("tag"),
                               "from_container": current["Id"], "to_container": None, "aside": aside,
                               "config": config, "inspect": kept, "began": time.time(), "before": _brief(before)},
                       serve=None)
        for key in ("series", "series_id", "sglang_version"):
            journal[key] = request.get(key)
        journal = self.write_journal(journal, Phase.SWITCHING)
        self.emitter.current = "switch"
        if self.c.get("compose_file"):
            return self._compose_switch(journal, before, to["id"])
        created = None
        try:
            with self.lock.fenced("stopping the container"):
                run(cli.stop_argv(self.engine, name, float(self.c.get("stop_timeout_s") or 30)),
                    timeout_s=float(self.c.get("stop_timeout_s") or 30) + PROBE_S)
                run(cli.rename_argv(self.engine, name, aside))
            self.hooks.at("exit_after_rename")  # a test's kill mid-switch (wire.Hooks)
            with self.lock.fenced("creating the new container"):
                created = run(cli.create_argv(self.engine, name, to["id"], config))["out"].strip().splitlines()[-1]
                journal["switch"]["to_container"] = created
                journal = self.write_journal(journal, Phase.SWITCHING)
                run(cli.start_argv(self.engine, name))
        except AgentError as exc:
            undone = self._put_back(created, aside, name)
            self._journal_back(before)
            raise AgentError(exc.code, "%s; %s" % (exc.message, undone))
        finally:
            self.emitter.current = None
        return self._switched(journal)

    def _switched(self, journal):
        journal["switch"]["started"] = time.time()
        journal = self.write_journal(journal, Phase.SWITCHED)
        self.history.record("switch", outcome="ok", container=self.c["name"], phase=Phase.SWITCHED,
                            switch=_brief_switch(journal))
        return {"journal": journal}

    def _journal_back(self, before):
        """The journal as it was before a switch that was undone in the same op."""
        with self.lock.fenced("restoring the journal"):
            if before:
                write_json_atomic(self.folder.path("journal.json"), before)
            elif os.path.exists(self.folder.path("journal.json")):
                os.remove(self.folder.path("journal.json"))

    # -- compose: the service recreated by `compose up -d` with the image overridden (no aside)

    def _compose_up(self, image):
        """``compose up -d`` of the service with ``image`` (an override file of ours names it)."""
        override = self.folder.path("compose.override.json")
        with self.lock.fenced("writing the compose override"):
            write_json_atomic(override, json.loads(cli.compose_override(self.c["service"], image)))
            run(cli.compose_up_argv(self.engine, self.c["compose_file"], override, self.c["service"]),
                timeout_s=float(self.c.get("stop_timeout_s") or 30) + 600)
        found = self.inspect_one("container", self.c["name"])
        if found is None:
            raise AgentError(Code.ENGINE_FAILED, "compose up ran, but no container is named %s: set container.name "
                             "to the name compose gives the service's container" % self.c["name"])
        return found["Id"]

    def _compose_switch(self, journal, before, image):
        journal["switch"]["aside"] = None
        try:
            journal["switch"]["to_container"] = self._compose_up(image)
        except AgentError as exc:
            try:
                self._compose_up(journal["switch"]["from_image"])
                undone = "the service was brought up again with the old image"
            except AgentError as again:
                undone = "bringing the service up again with the old image FAILED too: %s" % again.message
            self._journal_back(before)
            raise AgentError(exc.code, "%s; %s" % (exc.message, undone))
        finally:
            self.emitter.current = None
        return self._switched(journal)

    def _put_back(self, created, aside, name):
        """After a failed switch: the new container removed, the old one renamed back and started."""
        said = []
        if created is not None or (name in self.names() and aside in self.names()):
            run(cli.rm_argv(self.engine, name), ok=False)
            said.append("the new container removed")
        if aside in self.names():
            run(cli.rename_argv(self.engine, aside, name), ok=False)
        done = run(cli.start_argv(self.engine, name), ok=False)
        said.append("the old container %s" % ("started again" if done["rc"] == 0 else "NOT started: " + _why(done, 60)))
        return ", ".join(said)

    def op_verify(self, request):
        """The switched container runs and is healthy (a 200 from its health URL), and with a
        ``proof`` serves DDTree: {healthy, failed, detail, health, proof}. Recorded in the journal."""
        self._need()
        name = self.c["name"]
        journal = self.read_journal() or {}
        want = (journal.get("switch") or {}).get("to_container") if request.get("switched", True) else None
        timeout_s = float(request.get("ready_timeout_s") or 600)
        poll_s = float(request.get("poll_s") or 2)
        started = time.monotonic()
        deadline = started + timeout_s
        self.emitter.current = "health"
        # ``healthy``, not ``ok``: the request itself was answered (``ok`` is the op's, set by handle).
        answer = {"healthy": False, "failed": None, "detail": "", "health": None, "proof": None, "container": None}
        status, polls = None, 0
        try:
            while True:
                polls += 1
                doc = self.inspect_one("container", name)
                found = _summary(doc) if doc else None
                answer["container"] = found
                why = None
                if found is None:
                    why = "no container named %s" % name
                elif want and found["id"] != want:
                    why = "container %s is %s, not the one this run created (%s)" % (name, found["id"][:12], want[:12])
                elif not found["running"]:
                    why = "the container is not running (%s, exit code %s)" % (found["status"], found["exit_code"])
                if why is not None and (found is None or (want and found["id"] != want) or
                                        found["status"] in ("exited", "dead", "stopped")):
                    answer.update(failed="health", detail=why + self._logs(found))
                    break
                status, _ = server.http_request("GET", request["health_url"], timeout=10.0)
                if status == 200 and why is None:
                    answer["health"] = {"url": request["health_url"], "status": status, "polls": polls,
                                        "seconds": round(time.monotonic() - started, 2)}
                    break
                if time.monotonic() >= deadline:
                    answer.update(failed="health", detail="the container was not healthy %g s after its start (last "
                                  "health status %s)%s" % (timeout_s, status if status is not None else
                                                           "none: nothing answered", self._logs(found)))
                    break
                time.sleep(max(0.05, min(poll_s, deadline - time.monotonic())))
            if answer["failed"] is None and request.get("proof"):
                self.emitter.current = "proof"
                evidence = {}
                try:
                    smoke.prove_served(request["proof"], request["url"], evidence)
                    answer["proof"] = evidence
                except server.StepFailed as exc:
                    answer.update(failed="proof", detail=exc.detail, proof=dict(evidence, **exc.evidence))
            answer["healthy"] = answer["failed"] is None
            if answer["healthy"]:
                answer["detail"] = _healthy_line(answer)
        finally:
            self.emitter.current = None
        if self.held.locked and journal:
            record = {"state": "healthy" if answer["healthy"] else "unhealthy", "time": wire.now_iso(),
                      "failed": answer["failed"], "detail": answer["detail"][:500],
                      "proof": None if not request.get("proof") else "tree" if request["proof"].get("probe") else "width",
                      "run_id": journal.get("run_id")}
            with self.lock.fenced("recording the health check"):
                journal = dict(self.read_journal() or journal, serve=record)
                write_json_atomic(self.folder.path("journal.json"), journal)
        return answer

    def _logs(self, found):
        if found is None:
            return ""
        done = run(cli.logs_argv(self.engine, found["id"]), ok=False)
        lines = (done["out"] + done["err"]).strip().splitlines()
        return "; its log ends: %s" % " | ".join(lines[-3:])[:600] if lines else ""

    def op_keep(self, request):
        """The switch stands: the container kept aside is removed, the journal moves on."""
        self._locked("keep")
        journal = self.read_journal()
        if not journal or journal.get("run_id") != request["run_id"] or journal.get("phase") != Phase.SWITCHED:
            raise AgentError(Code.CHANGED, "the journal is not at phase switched of run %s: %s"
                             % (request["run_id"], _brief(journal)))
        sw = journal["switch"]
        aside = sw.get("aside")
        if aside and aside in self.names():
            with self.lock.fenced("removing the container kept aside"):
                run(cli.rm_argv(self.engine, aside))
        phase = request["phase"]
        journal["image"] = {"id": sw["to_image"], "tag": sw.get("to_tag")}
        journal["previous"] = {"id": sw["from_image"], "tag": sw.get("from_tag")}
        journal["container_id"] = sw.get("to_container")
        journal["automatic"] = request.get("automatic")
        journal = self.write_journal(journal, phase)
        warning = self.history.record(sw["kind"], outcome="ok", container=self.c["name"], phase=phase,
                                      series=journal.get("series"), series_id=journal.get("series_id"),
                                      image=journal["image"], previous=journal["previous"], serve=journal.get("serve"),
                                      automatic=request.get("automatic"))
        return {"journal": journal, "history_warning": warning}

    def _restore_container(self, sw, name, aside):
        """The old container back under ``name``: the one kept aside, else one created from the
        recorded configuration with the old image; started. -> how, in words."""
        names = self.names()
        if name in names:
            doc = self.inspect_one("container", name) or {}
            if aside in names or doc.get("Image") == sw["to_image"] or doc.get("Id") == sw.get("to_container"):
                run(cli.rm_argv(self.engine, name))
            else:
                raise AgentError(Code.CHANGED, "container %s (%s) is neither this run's nor the one it kept aside: "
                                 "nothing was changed" % (name, str(doc.get("Id"))[:12]))
        if aside and aside in names:
            run(cli.rename_argv(self.engine, aside, name))
            how = "the old container, kept aside as %s, is back" % aside
        else:
            run(cli.create_argv(self.engine, name, sw["from_image"], sw["config"]))
            how = "a container of the old image was created with the recorded configuration"
        run(cli.start_argv(self.engine, name))
        return how

    def op_restore(self, request):
        """Undo the journal's switch: the old container back under its name (the one kept aside,
        or one created from the recorded configuration with the old image), started."""
        self._locked("restore")
        journal = self.read_journal()
        if not journal or journal.get("phase") not in (Phase.SWITCHING, Phase.SWITCHED) or not journal.get("switch"):
            raise AgentError(Code.CHANGED, "no switch to undo: %s" % _brief(journal))
        sw = journal["switch"]
        name, aside = self.c["name"], sw["aside"]
        self.emitter.current = "restore"
        try:
            with self.lock.fenced("undoing the switch"):
                if self.c.get("compose_file"):
                    self._compose_up(sw["from_image"])
                    how = "the service was brought up again with the old image (compose up -d)"
                else:
                    how = self._restore_container(sw, name, aside)
        finally:
            self.emitter.current = None
        back = (sw.get("before") or {})
        undone_kind = sw.get("kind")
        phase = Phase.ROLLED_BACK if undone_kind == "push" else back.get("phase") or Phase.DEPLOYED
        restored = dict(journal, phase=phase, run_id=request["run_id"], command=request.get("command"),
                        image={"id": sw["from_image"], "tag": sw.get("from_tag")},
                        previous={"id": sw["to_image"], "tag": sw.get("to_tag")} if undone_kind == "push"
                        else back.get("previous"),
                        automatic=request.get("automatic"), serve=None, undone=_brief_switch(journal))
        after = self.inspect_one("container", name)
        restored["container_id"] = after["Id"] if after else None
        if undone_kind != "push":
            for key in ("series", "series_id", "sglang_version"):
                restored[key] = back.get(key)
        restored = self.write_journal(restored, phase)
        warning = self.history.record("restore", outcome="ok", container=name, phase=phase, how=how,
                                      undone=restored["undone"], automatic=request.get("automatic"))
        return {"journal": restored, "how": how, "history_warning": warning}


def _summary(doc):
    state = doc.get("State") or {}
    cfg = doc.get("Config") or {}
    return {"id": doc.get("Id"), "name": str(doc.get("Name") or "").lstrip("/"), "image": doc.get("Image"),
            "image_ref": cfg.get("Image") or doc.get("ImageName"), "status": state.get("Status"),
            "running": bool(state.get("Running")) and not state.get("Restarting"),
            "restarting": bool(state.get("Restarting")), "exit_code": state.get("ExitCode"),
            "pid": state.get("Pid"), "started": state.get("StartedAt"), "created": doc.get("Created"),
            "labels": cfg.get("Labels") or {}}


def _image_summary(doc):
    cfg = doc.get("Config") or {}
    # ``env``: the image's CUDA_VERSION only (its CUDA, when NVIDIA's base set it), never the
    # rest of its environment (it may hold what an operator baked in).
    env = [e for e in cfg.get("Env") or () if isinstance(e, str) and e.startswith("CUDA_VERSION=")]
    return {"id": doc.get("Id"), "tags": doc.get("RepoTags") or [], "digests": doc.get("RepoDigests") or [],
            "digest": doc.get("Digest"), "created": doc.get("Created"), "labels": cfg.get("Labels") or {},
            "env": env}


def _brief(journal):
    """A journal in a few fields (what a switch records of the journal before it)."""
    if not journal:
        return None
    return {k: journal.get(k) for k in ("phase", "run_id", "series", "series_id", "sglang_version", "image",
                                        "previous")}


def _brief_switch(journal):
    sw = journal.get("switch") or {}
    return {k: sw.get(k) for k in ("kind", "from_image", "to_image", "from_container", "to_container", "aside")}


def _healthy_line(answer):
    health = answer["health"]
    line = "healthy %.1f s after the start (container %s)" % (health["seconds"], (answer["container"] or {}).get(
        "id", "?")[:12])
    tree = (answer.get("proof") or {}).get("tree")
    return line + "; " + smoke.tree_line(tree) if tree else line


# Each request's "op" -> the part that answers it and its method (``program``: Containers itself).
OPS = {"init": ("program", "op_init"), "inspect": ("program", "op_inspect"), "lock": ("lock", "op_lock"),
       "unlock": ("lock", "op_unlock"), "build": ("program", "op_build"), "switch": ("program", "op_switch"),
       "verify": ("program", "op_verify"), "keep": ("program", "op_keep"), "restore": ("program", "op_restore"),
       # `history` and `lock status/release` (session/hostlog.py): the agent's own jobs, on this state
       "history": ("history", "op_history"), "lock_status": ("lock", "op_lock_status"),
       "lock_release": ("lock", "op_lock_release"),
       "speed": ("history", "op_speed")}  # the speed gate's history line (history.py's, as the agent's)


def handle(program, request):
    part, method = OPS.get(str(request.get("op")), (None, None))
    fn = getattr(program if part == "program" else getattr(program, part), method) if part else None
    if fn is None:
        return {"ok": False, "code": Code.PROTOCOL, "message": "unknown op %r" % (request.get("op"),)}
    try:
        result = fn(request)
    except AgentError as exc:
        return dict(exc.extra, ok=False, code=exc.code, message=exc.message)
    except OSError as exc:
        return {"ok": False, "code": Code.OS_ERROR, "message": describe_os_error(exc)}
    result["ok"] = True
    return result


def serve(stdin, stdout):
    """Answer one JSON line per request until EOF; always release the lock at the end."""
    out = wire.Emitter(stdout, wire.HEARTBEAT_S)
    program = Containers(out)
    try:
        wire.answer_lines(stdin, out, program.hooks, lambda request: handle(program, request), "container")
    finally:
        program.lock.release()
        out.close()


def main():
    # Like the agent: a dropped connection (or Ctrl-C at the controller's terminal, for a
    # local run) must not stop a step half-way; the end of the input releases the lock.
    wire.keep_working(signal.SIGINT)
    serve(sys.stdin.buffer, sys.stdout.buffer)


if __name__ == "__main__":
    main()
