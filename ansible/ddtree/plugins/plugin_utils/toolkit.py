# -*- coding: utf-8 -*-
# MIT License (see the ddtree-deploy repository)
"""Controller side of the ddtree.deploy action plugins: run ``ddtree-deploy ... --json``.

Why the controller runs the toolkit (and not a module on the host): a push is more than
a file copy. The series is checked in memory against the host's exact SGLang release,
drift is refused, the host agent backs up, stages, verifies and switches by rename
under the deploy lock, journals, and the smoke levels run with auto-rollback. All of
that already lives in ``ddtree-deploy`` and its stdlib host agent, reached over the
toolkit's own strict-host-key SSH transport; re-implementing it as an Ansible module
would be a second applier. So each task writes the host's inventory file from its
Ansible variables (hostmap.py, the toolkit's own mapping), runs the CLI once with
``--json`` on the controller, and turns the one JSON document into an Ansible result.
Ansible keeps what it is good at: inventories, ``serial`` (canary and waves),
``max_fail_percentage``, ``forks``, check and diff mode, reporting.
"""

import difflib
import json
import os
import shutil
import subprocess
import tempfile

from ansible_collections.ddtree.deploy.plugins.plugin_utils.hostmap import HOST_VARIABLES, MappingError, host_toml

DIFF_MAX_BYTES = 1 << 20  # larger files are summarised by hash in diff mode


def host_vars(action, task_vars):
    """name, {var: templated value} for the task's host: the variables that describe a host
    (hostmap.HOST_VARIABLES), templated once per task."""
    templar = action._templar
    values = {}
    for var in HOST_VARIABLES:
        if var in task_vars:
            values[var] = templar.template(task_vars[var])
    name = values.get("ddtree_name") or task_vars.get("inventory_hostname")
    return name, values


def toolkit_cmd(args, values):
    cmd = args.get("ddtree_deploy") or values.get("ddtree_deploy_cmd") or "ddtree-deploy"
    if os.sep not in cmd:
        found = shutil.which(cmd)
        if found is None:
            raise MappingError("%s not found on the controller's PATH; install it (pip install ddtree-deploy) "
                               "or set ddtree_deploy_cmd / the module's ddtree_deploy option to its path" % cmd)
        cmd = found
    return [cmd]


def run_json(argv, timeout):
    """(exit code, the one JSON document or None, stderr tail).

    The document is the toolkit's envelope (docs/json.md): ``schema``, ``command``, ``ok``,
    ``exit_code``, ``error`` (null or code/message/hint), ``hosts`` (each with ``host`` and
    ``ok``), and the command's own fields beside them."""
    env = dict(os.environ, COLUMNS=os.environ.get("COLUMNS", "120"))
    try:
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return 124, None, "ddtree-deploy ran longer than %s s (the module's timeout option)" % timeout
    try:
        doc = json.loads(proc.stdout.decode("utf-8"))
    except ValueError:
        doc = None
    return proc.returncode, doc, proc.stderr.decode("utf-8", "replace")[-4000:]


def run_command(action, command, task_vars, args):
    """One ddtree.deploy task: push | status | rollback | restart. Returns the Ansible result dict."""
    result = {"changed": False}
    check_mode = bool(action._task.check_mode)
    if command == "restart" and check_mode:  # a restart has no dry run: say what it would do
        return dict(result, changed=True, msg="check mode: would restart the host's server ([serve] restart)")
    diff_mode = bool(action._task.diff)
    name, values = host_vars(action, task_vars)
    workdir = tempfile.mkdtemp(prefix="ddtree-ansible-")
    try:
        try:
            text = host_toml(name, values.get)
            argv = toolkit_cmd(args, values)
        except MappingError as exc:
            return dict(result, failed=True, msg=str(exc), code="bad-input", rc=2)
        inventory = os.path.join(workdir, "%s.toml" % name)
        with open(inventory, "w") as f:
            f.write(text)
        argv += [command, "--host", inventory, "--json"]
        argv += _options(command, args, check_mode)
        rc, doc, stderr = run_json(argv, args.get("timeout") or 3600)
        result["rc"] = rc
        result["cmd"] = argv
        if doc is None:
            return dict(result, failed=True, msg="ddtree-deploy gave no JSON (exit %d): %s"
                        % (rc, stderr.strip().splitlines()[-1] if stderr.strip() else "no output"),
                        stderr=stderr)
        host = (doc.get("hosts") or [None])[0]
        err = (host or {}).get("error") or (doc.get("error") if host is None else None)
        if err:  # the toolkit's one-line error and hint (exit 1 or 2): the host's, or the run's (bad input)
            return dict(result, failed=True, msg=err.get("message"), hint=err.get("hint"), code=err.get("code"))
        if host is None:  # never expected: a push/status/rollback with no host and no error
            return dict(result, failed=True, msg="ddtree-deploy reported no host (exit %d)" % rc)
        result["ddtree"] = host
        if command == "status":
            result["msg"] = "%s: %s" % (host.get("phase"), host.get("explanation"))
            return result
        if command == "restart":
            # changed: the server was restarted (the command ran), healthy or not.
            restarted = host.get("restart") or {}
            result["changed"] = bool((restarted.get("restart") or {}).get("rc") == 0)
            result["msg"] = restarted.get("detail") or host.get("outcome")
            if host.get("ok") is False or rc != 0:
                result.update(failed=True, msg="server %s after the restart (%s): %s"
                              % (restarted.get("state"), restarted.get("failed"), restarted.get("detail")))
            return result
        plan = host.get("plan") or {}
        changes = [f for f in plan.get("files") or () if f.get("action") != "keep"]
        # changed: files were switched (or, in check mode, would be).
        result["changed"] = bool(changes) if check_mode else bool(host.get("changed"))
        result["msg"] = host.get("summary")
        if host.get("ok") is False or rc != 0:
            result.update(failed=True, msg=_failure(host, rc))
            if host.get("error"):
                result.update(msg=host["error"].get("message"), hint=host["error"].get("hint"),
                              code=host["error"].get("code"))
        if diff_mode and changes:
            result["diff"] = file_diffs(argv[0], command, host, changes, args, workdir)
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _failure(host, rc):
    """One line for a push whose switch happened but whose smoke failed (or could not run), or
    whose server was not healthy after its restart ([serve])."""
    serve = (host.get("serve") or {}).get("restart")
    if serve and not serve.get("ok"):
        line = "server %s after the restart (%s): %s" % (serve.get("state"), serve.get("failed"), serve.get("detail"))
        if (host.get("serve") or {}).get("rolled_back"):
            line += "; rolled back automatically"
        return line
    if host.get("smoke_error"):
        return "smoke could not run: %s" % host["smoke_error"]
    levels = (host.get("smoke") or {}).get("levels") or ()
    failed = next((lv for lv in levels if lv.get("status") == "failed"), None)
    if failed is None:
        return host.get("mark_error") or host.get("summary") or "failed (exit %d)" % rc
    line = "smoke level %s failed: %s" % (failed.get("level"), failed.get("detail"))
    undo = host.get("auto_rollback") or {}
    if undo.get("done"):
        line += "; rolled back automatically (%s)" % ((undo.get("outcome") or {}).get("summary") or "done")
    elif undo.get("kept_new_files"):
        line += "; the new files were kept (rollback_on_failure: false), phase %s" % host.get("phase")
    elif undo:
        line += "; NOT rolled back: %s" % (undo.get("error") or "unknown")
    return line


def _options(command, args, check_mode):
    out = []
    if command in ("push", "status") and args.get("family"):
        out += ["--family", args["family"]]
    if command in ("push", "rollback"):
        if check_mode:
            out.append("--dry-run")
    if command in ("push", "rollback", "restart") and args.get("break_lock"):
        out.append("--break-lock")
    if args.get("trust_new_host"):
        out.append("--trust-new-host")
    if command == "push":
        if args.get("smoke") is False:
            out.append("--no-smoke")
        for level in args.get("levels") or ():
            out += ["--level", level]
        if args.get("rollback_on_failure") is False:
            out.append("--no-rollback")
    if command == "rollback" and args.get("to"):
        out += ["--to", args["to"]]
    return out


def file_diffs(cmd, command, host, changes, args, workdir):
    """Per-file before/after for Ansible's diff mode.

    The host's files are, by the drift check, byte-identical to either the release's
    pristine file or the series' patched file, so both sides come from the toolkit on the
    controller (the release snapshot and ``check --write``), matched by sha256; a side
    that matches neither (a host's own pulled snapshot) is shown by its hash.
    """
    version = host.get("sglang_version")
    known = {}
    rc, snap, _ = run_json([cmd, "snapshot", "release", version, "--json"], 600)
    if rc == 0 and snap and "folder" in snap:
        for entry in snap.get("manifest", {}).get("files", ()):
            if not entry.get("absent"):
                known[entry["sha256"]] = os.path.join(snap["folder"], "files", entry["path"])
        written = os.path.join(workdir, "patched")
        check = [cmd, "check", "--snapshot", snap["snapshot"], "--write", written, "--json"]
        if args.get("family"):
            check += ["--family", args["family"]]
        rc, _doc, _ = run_json(check, 600)
        if rc == 0:
            for top, _dirs, files in os.walk(written):
                for fname in files:
                    path = os.path.join(top, fname)
                    known[_sha256(path)] = path
    diffs = []
    for f in changes:
        before, after = _side(known, f.get("current")), _side(known, f.get("want"))
        label = {"push": ("host", "patched"), "rollback": ("host", "backup")}.get(command, ("host", "new"))
        diffs.append({
            "before_header": "%s (%s %s)" % (f["path"], label[0], (f.get("current") or "absent")[:12]),
            "after_header": "%s (%s %s)" % (f["path"], label[1], (f.get("want") or "absent")[:12]),
            "before": before,
            "after": after,
        })
    return diffs


def _side(known, sha):
    if sha is None:
        return ""
    path = known.get(sha)
    if path is None or os.path.getsize(path) > DIFF_MAX_BYTES:
        return "<sha256 %s: content not available on the controller>\n" % sha
    with open(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


def _sha256(path):
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def unified(diff):  # used by tests and docs: the text Ansible's callback prints
    return "".join(difflib.unified_diff(diff["before"].splitlines(True), diff["after"].splitlines(True),
                                        diff["before_header"], diff["after_header"]))


_COMMON = {
    "ddtree_deploy": {"type": "str"},
    "trust_new_host": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 3600},
}
#: Each action's options (the modules' DOCUMENTATION says the same, for ansible-doc).
SPECS = {
    "push": dict(_COMMON, family={"type": "str"}, smoke={"type": "bool", "default": True},
                 levels={"type": "list", "elements": "str"}, rollback_on_failure={"type": "bool", "default": True},
                 break_lock={"type": "bool", "default": False}),
    "rollback": dict(_COMMON, to={"type": "str"}, break_lock={"type": "bool", "default": False}),
    "status": dict(_COMMON, family={"type": "str"}),
    "restart": dict(_COMMON, break_lock={"type": "bool", "default": False}),
}


def action_module(command):
    """The ActionModule class of the ``command`` action plugin (push, status, rollback): they
    differ only in the command they run, so each plugin file is one line over this."""
    from ansible.plugins.action import ActionBase

    class ActionModule(ActionBase):
        # The toolkit opens its own SSH connection (strict host keys, one agent session):
        # Ansible's connection to the host is never used.
        _requires_connection = False
        _supports_check_mode = True
        _supports_async = False

        def run(self, tmp=None, task_vars=None):
            super(ActionModule, self).run(tmp, task_vars)
            _valid, args = self.validate_argument_spec(argument_spec=SPECS[command])
            return run_command(self, command, task_vars or {}, args)

    return ActionModule
