"""Applies the series INSIDE a container build (the ``RUN`` step of ``ddtree-deploy image``).

Copied into the build context as ``ddtree/apply.py`` next to the toolkit's own host agent
(``agent.py``), its pure plan module (``lib/ddtree_deploy/session/plan.py``, ``base/errors.py``) and the
request ``push`` would send (``apply-request.json``: the series' patched bytes, computed on
the controller against the pristine release, with the backup and journal entries). It is
the client half of a push run on the image itself, no second applier:

1. the agent (a child process, the same JSON protocol as over SSH) takes the deploy lock
   and reports the image's sglang: package root found from the interpreter (an editable
   install such as lmsysorg/sglang's /sgl-workspace/sglang/python included), version, the
   sha256 of every target file;
2. the version must be the release the series was checked against, and ``plan_push`` (the
   same drift check as ``push``) must find every file pristine or already patched; else the
   build fails naming the files;
3. the agent backs up, stages, verifies and switches the files, journals ``deployed``;
4. the switched files are byte-compiled with the image's interpreter.

Stdlib only; runs with the image's Python (3.8+). Exit 0 done (or already patched), 1 refused
or failed (the message names what and why), 2 a broken build context.
"""

import argparse
import json
import os
import py_compile
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message, code=1):
    sys.stderr.write("ddtree-deploy image: error: %s\n" % message)
    sys.exit(code)


def say(message):
    sys.stderr.write("ddtree-deploy image: %s\n" % message)


class Agent(object):
    """The toolkit's host agent as a child process: one JSON line per request and per answer."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "agent.py")],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def call(self, *requests):
        for r in requests:
            self.proc.stdin.write((json.dumps(r) + "\n").encode())
        self.proc.stdin.flush()
        answers = []
        for _r in requests:
            line = self.proc.stdout.readline()
            if not line:
                fail("the host agent stopped answering (exit %s)" % self.proc.poll())
            answers.append(json.loads(line.decode()))
        return answers

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def expect(reply, what):
    if not reply.get("ok"):
        fail("%s: %s" % (what, reply.get("message") or reply.get("code")))
    return reply


def main(argv=None):
    ap = argparse.ArgumentParser(description="apply the DDTree series inside an image, through the host agent")
    ap.add_argument("--state-dir", help="the agent's state folder (default: the one in apply-request.json)")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.join(HERE, "lib"))
    try:
        from ddtree_deploy.base.errors import DeployError
        from ddtree_deploy.hostprog.protocol import PROTOCOL
        from ddtree_deploy.session.plan import Desired, Target, plan_push

        with open(os.path.join(HERE, "series.json")) as f:
            meta = json.load(f)
        with open(os.path.join(HERE, "apply-request.json")) as f:
            request = json.load(f)
    except (OSError, ValueError, ImportError) as exc:
        fail("broken build context %s: %s" % (HERE, exc), 2)
    state_dir = args.state_dir or meta["state_dir"]
    paths = [t["path"] for t in meta["targets"]]
    agent = Agent()
    try:
        init, lock, facts = agent.call(
            {"op": "init", "protocol": PROTOCOL, "state_dir": state_dir},
            {"op": "lock", "run_id": request["run_id"], "holder": "ddtree-deploy image", "command": "image"},
            {"op": "facts", "paths": paths})
        expect(init, "agent start")
        expect(lock, "lock")
        expect(facts, "read the image's sglang")
        root, version = facts["package_root"], facts["sglang_version"]
        say("sglang %s at %s (%s)" % (version, root, sys.executable))
        if version != meta["sglang_version"]:
            # Its own command text, not next_step's: this program runs in the image build alone.
            fail("the image's sglang at %s is %s, but the series %s was checked against the pristine %s release; "
                 "build FROM an image of SGLang %s, or rerun `ddtree-deploy image --release %s`"
                 % (root, version, meta["series"], meta["sglang_version"], meta["sglang_version"], version))
        for info in facts["files"].values():
            if info and "unsafe" in info:
                fail(info["unsafe"])
        current = {p: (facts["files"].get(p) or {}).get("sha256") for p in paths}
        by_path = {f["path"]: f for f in request["files"]}
        desired = Desired(series=meta["series"], series_id=meta["series_id"], sglang_version=meta["sglang_version"],
                          snapshot=meta["snapshot"],
                          targets=tuple(Target(path=t["path"], pristine=t["pristine"], patched=t["patched"],
                                               data=b"", mode=t["mode"]) for t in meta["targets"]))
        try:
            plan = plan_push("image", desired, current, facts["journal"])
        except DeployError as exc:  # the same drift check as push: every drifted file named
            fail("%s (the image's sglang is not the pristine %s release the series expects)"
                 % (exc.message, meta["sglang_version"]))
        if plan.noop:
            say("already patched: %s (%s); nothing changed" % (meta["series"], meta["series_id"][:12]))
            agent.call({"op": "unlock"})
            return 0
        request = dict(request, files=[dict(by_path[s.path], expect=s.current) for s in plan.changes])
        applied, _unlock = agent.call(request, {"op": "unlock"})
        done = expect(applied, "apply")
    finally:
        agent.close()
    for rel in paths:  # the agent purged the replaced files' bytecode: compile the new files now
        path = os.path.join(root, *rel.split("/"))
        try:
            py_compile.compile(path, doraise=True)
        except py_compile.PyCompileError as exc:
            fail("byte-compiling %s: %s" % (rel, exc.msg))
    say("applied %s (%s): %d file(s) switched, backup %s, journal deployed in %s; byte-compiled %d file(s)"
        % (meta["series"], meta["series_id"][:12], len(done["switched"]), done["backup_id"], state_dir, len(paths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
