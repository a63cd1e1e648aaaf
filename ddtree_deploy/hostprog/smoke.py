"""The host-side smoke program: runs the smoke levels ON the host and answers JSON.

Stdlib only, run with the host's own interpreter (the one SGLang is installed in),
so what it proves is what that interpreter sees. It reads one JSON request on
stdin (or from the file named by its only argument) and prints one JSON document
on stdout; it never changes the installed files. The request is built by
``ddtree_deploy.smoke.plan`` (pure); this program knows nothing about DDTree beyond
what the request names, so its logic can be tested locally with plain
subprocesses.

Request::

    {"levels": ["compile", "import", "cli", "launch"],
     "compile": {"package": "sglang", "files": ["sglang/srt/x.py", ...]},  # or absolute files
     "import":  {"modules": [...], "attributes": [["module", "Attr.PATH"], ...], "timeout_s": 120,
                 "tree": TREE_PROBE | null},
     "cli":     {"argv": [...], "expect": ["--flag", ...], "timeout_s": 120,
                 "validate": {"module": "...", "function": "prepare_server_args", "argv": [...],
                              "needs_paths": [...], "report": ["field", ...],
                              "plugins": [m, f], "resolve": "method", "view": [m, f],
                              "width": {"field", "budget", "budget_field", "budget_flag"},
                              "hybrid_report": [m, f] (optional)} | null},
     "launch":  {"argv": [...], "host": "127.0.0.1", "port": 30000, "log_path": "...",
                 "gpu_check": true, "min_free_mib": 0, "ready_timeout_s": 900,
                 "poll_s": 1.0, "probe": {"text": "...", "max_new_tokens": 32},
                 "probe_timeout_s": 120, "expect_algorithm": "DDTREE",
                 "tree": {"budget": 64 | null, "budget_field": "...", "worker_class": "..." | null,
                          "prompts": [...], "max_new_tokens": 256} | null,
                 "term_grace_s": 20, "log_tail_lines": 40}}

    TREE_PROBE = {"plugins": [m, f], "parse": [m, f], "resolve": "method", "view": [m, f],
                  "algorithm": [m, "Class"], "argv": [... "{model}" ... "{draft_model}" ...],
                  "configs": {"model": {config.json}, "draft_model": {...}},
                  "width_field": "...", "budget": 24, "budget_flag": "--...",
                  "marker": "ATTR", "worker_class": "Name" | null, "skip_worker": "module" | null,
                  "hybrid": {"argv": [... "{hybrid_model}" ...], "report": [m, f]} (optional)}

``hybrid_report`` / ``hybrid`` (a family that serves hybrid targets): the function called with
the resolved ServerArgs returns None (pure attention) or a dict whose ``tree_path`` and
``commit_hook_found`` must be true (the recurrent tree path on, the accepted node's state
committed); the tree probe runs it on a tiny hybrid config, the cli level on the host's model.

``[m, f]`` names a module and an attribute path in it; one that does not exist in the
release is skipped (older releases have no plugin loader or resolution view).

Answer: ``{"ok": bool, "levels": [{"level", "ok", "status", "seconds", "detail",
"evidence"}...]}``; ``status`` is ``passed``, ``failed`` or ``skipped``. Levels run in
the order given and stop at the first failure (later ones are ``skipped``), because a
module that does not compile cannot import and a server that cannot import cannot start.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from ddtree_deploy.hostprog import server, wire
from ddtree_deploy.hostprog.server import StepFailed, tail


def _run(argv, timeout_s, cwd=None):
    """A probe of this program's (``run_group``, own): (rc, combined output); rc None = timed out."""
    done = server.run_group(argv, timeout_s, cwd, own="smoke")
    return done["rc"], done["output"]


# --------------------------------------------------------------------- compile


def level_compile(spec):
    """Byte-compile every patched file in memory: no .pyc is written into the package."""
    files = spec.get("files") or []
    if not files:
        raise StepFailed("no files to compile: the request names none")
    evidence = {"files": len(files)}
    if spec.get("package"):
        # Package-relative paths: resolve them where THIS interpreter finds the package,
        # which is where the push put the files and where the import level imports from.
        root = server.package_root(spec["package"])
        files = [os.path.join(root, rel) for rel in files]
        evidence["root"] = root
    for path in files:
        try:
            with open(path, "rb") as fh:
                source = fh.read()
        except OSError as exc:
            raise StepFailed(f"{path}: cannot read ({exc.strerror})", {"file": path})
        try:
            compile(source, path, "exec", dont_inherit=True)
        except SyntaxError as exc:
            raise StepFailed(
                f"{path}:{exc.lineno}: {exc.msg}",
                {"file": path, "line": exc.lineno, "text": (exc.text or "").rstrip()},
            )
        except ValueError as exc:  # e.g. null bytes
            raise StepFailed(f"{path}: {exc}", {"file": path})
    return f"{len(files)} files byte-compiled", evidence


# ---------------------------------------------------------------------- import

# Runs in a child interpreter (a fresh process: nothing cached from this one, and a
# hanging import is bounded by the level's timeout). Its last stdout line is JSON.
_IMPORT_CHILD = r"""
import importlib, json, sys, traceback
spec = json.loads(sys.argv[1])
done = []
for name in spec["modules"]:
    try:
        importlib.import_module(name)
    except BaseException as exc:
        print(json.dumps({"ok": False, "module": name,
                          "error": "%s: %s" % (type(exc).__name__, exc),
                          "traceback": traceback.format_exc()[-3000:]}))
        sys.exit(0)
    done.append(name)
for module, path in spec.get("attributes", []):
    obj = importlib.import_module(module)
    try:
        for part in path.split("."):
            obj = getattr(obj, part)
    except AttributeError as exc:
        print(json.dumps({"ok": False, "module": module, "attribute": path, "error": str(exc)}))
        sys.exit(0)
answer = {"ok": True, "modules": done, "file": {m: getattr(sys.modules[m], "__file__", None) for m in done}}
tree = spec.get("tree")
if tree:
    answer["tree"] = tree_probe(tree)
print(json.dumps(answer, default=str))
"""

# Shared by the children that resolve server arguments: the release's own path, in
# launch_server's order (plugins, parse, resolve), read through its resolution view.
_RELEASE_HELPERS = r"""
import importlib, json, os, sys, traceback


def _get(path):
    obj = importlib.import_module(path[0])
    for part in path[1].split("."):
        obj = getattr(obj, part)
    return obj


def _optional(path):
    try:
        return _get(path)
    except (ImportError, AttributeError):
        return None


def release_args(spec, argv):
    load = _optional(spec["plugins"]) if spec.get("plugins") else None
    if load is not None:
        load()
    args = _get(spec["parse"])(argv)
    resolve = getattr(args, spec.get("resolve") or "", None)
    if callable(resolve):
        resolve()
    view = _optional(spec["view"]) if spec.get("view") else None
    return args, (view(args) if view is not None else args)


def _failure(stage, exc):
    return {"ok": False, "stage": stage, "error": "%s: %s" % (type(exc).__name__, exc),
            "traceback": traceback.format_exc()[-3000:]}


def tree_probe(tree):
    paths = {}
    for key, config in tree["configs"].items():
        os.makedirs(key, exist_ok=True)
        with open(os.path.join(key, "config.json"), "w") as fh:
            json.dump(config, fh)
        paths["{%s}" % key] = os.path.abspath(key)
    argv = [paths.get(a, a) for a in tree["argv"]]
    try:
        args, view = release_args(tree, argv)
    except BaseException as exc:
        return dict(_failure("server_args", exc), argv=argv)
    out = {"ok": True, "argv": argv, "width": getattr(view, tree["width_field"], None),
           "block": getattr(view, "speculative_dflash_block_size", None),
           "algorithm": str(getattr(view, "speculative_algorithm", None))}
    if tree.get("skip_worker"):
        return out
    try:
        algorithm = _get(tree["algorithm"]).from_string(getattr(view, "speculative_algorithm"))
        cls = algorithm.create_worker(args)
    except BaseException as exc:
        return dict(out, **_failure("worker", exc))
    out["worker"] = {"name": getattr(cls, "__name__", repr(cls)), "module": getattr(cls, "__module__", None),
                     "marker": repr(getattr(cls, tree["marker"], None))}
    out["worker"]["tree"] = getattr(cls, tree["marker"], None) is True
    if tree.get("hybrid"):
        out["hybrid"] = hybrid_probe(tree, paths)
    return out


def hybrid_probe(tree, paths):
    # The same resolution on the tiny hybrid target, and the family's report of it.
    argv = [paths.get(a, a) for a in tree["hybrid"]["argv"]]
    try:
        args, view = release_args(tree, argv)
    except BaseException as exc:
        return dict(_failure("server_args", exc), argv=argv)
    out = {"ok": True, "argv": argv, "width": getattr(view, tree["width_field"], None)}
    try:
        out["report"] = _get(tree["hybrid"]["report"])(args)
    except BaseException as exc:
        return dict(out, **_failure("report", exc))
    return out
"""
_IMPORT_CHILD = _RELEASE_HELPERS + _IMPORT_CHILD


def level_import(spec):
    modules = spec.get("modules") or []
    if not modules:
        raise StepFailed("no modules to import: the request names none")
    child = {"modules": modules, "attributes": spec.get("attributes", []), "tree": spec.get("tree")}
    timeout_s = float(spec.get("timeout_s", 180))
    answer, _ = _ask_child(_IMPORT_CHILD, child, timeout_s, doing="importing", who="the import check")
    if not answer.get("ok"):
        if "attribute" in answer:
            raise StepFailed(
                f"{answer['module']}.{answer['attribute']} does not exist ({answer['error']})", answer
            )
        raise StepFailed(f"import {answer['module']} failed: {answer['error']}", answer)
    attrs = ", ".join(f"{m}.{a}" for m, a in spec.get("attributes", []))
    detail = f"{len(modules)} modules imported" + (f"; {attrs} exists" if attrs else "")
    evidence = {"modules": answer["modules"], "files": answer["file"]}
    if spec.get("tree"):
        evidence["tree"] = answer.get("tree")
        detail += "; " + judge_tree_probe(spec["tree"], answer.get("tree") or {})
    return detail, evidence


def judge_tree_probe(tree, found):
    """The import level's tree probe, judged: one clear line for the first thing wrong."""
    algorithm = "DDTREE"
    budget, flag, field = tree["budget"], tree["budget_flag"], tree["width_field"]
    evidence = {"tree": found}
    if found.get("stage") == "server_args":
        raise StepFailed(f"DDTREE probe: the release's ServerArgs rejects {algorithm} with {flag} {budget} "
                         f"(tiny config folders): {found['error']}", evidence)
    width = found.get("width")
    if width != budget + 1:
        why = ""
        # The draft block: as resolved, else the probe's draft config (DFlash's own resolution
        # on v2 releases keeps it only in the width itself).
        blocks = {found.get("block"), ((tree.get("configs") or {}).get("draft_model") or {}).get("block_size")}
        if width is not None and width in blocks:
            why = ": that is the draft block, so DDTREE verifies a chain (the linear DFlash path)"
        raise StepFailed(f"DDTREE probe: {field} resolved to {width!r}, expected {budget + 1} "
                         f"({flag} {budget} + 1){why}", evidence)
    said = f"{algorithm} verify width {width} = budget {budget} + 1"
    if tree.get("skip_worker"):
        return (f"{said}; worker class not checked: {tree['skip_worker']} is excluded here "
                "(smoke.import_exclude)")
    return _judge_worker(tree, found, said) + _judge_hybrid_probe(tree, found)


def _judge_worker(tree, found, said):
    algorithm = "DDTREE"
    evidence = {"tree": found}
    if found.get("stage") == "worker":
        raise StepFailed(f"DDTREE probe: SpeculativeAlgorithm.from_string({algorithm!r}).create_worker "
                         f"failed: {found['error']}", evidence)
    worker = found.get("worker") or {}
    name = f"{worker.get('module')}.{worker.get('name')}"
    expected = tree.get("worker_class")
    if expected and worker.get("name") != expected:
        raise StepFailed(f"DDTREE probe: {algorithm} resolves to worker class {name}, expected {expected} "
                         "(the family's [smoke] worker_class)", evidence)
    if not worker.get("tree"):
        raise StepFailed(f"DDTREE probe: {algorithm} resolves to {name}, whose {tree['marker']} is "
                         f"{worker.get('marker')}, not True: that worker does not verify a tree "
                         "(silently linear)", evidence)
    return f"{said}; {algorithm} -> {worker.get('name')} ({tree['marker']} = True)"


def _judge_hybrid_probe(tree, found):
    """The tiny hybrid target's resolution (a family that serves hybrid targets): the same
    verify width, and the recurrent tree path on. '' when the family has no such probe."""
    if not tree.get("hybrid"):
        return ""
    got = found.get("hybrid") or {}
    evidence = {"tree": found}
    where = "DDTREE probe on the tiny hybrid target (Qwen3-Next: GDN layers)"
    if got.get("stage") == "server_args":
        raise StepFailed(f"{where}: the release's ServerArgs rejects it: {got['error']}", evidence)
    if got.get("stage") == "report":
        raise StepFailed(f"{where}: {'.'.join(tree['hybrid']['report'])} failed: {got['error']}", evidence)
    width, budget = got.get("width"), tree["budget"]
    if width != budget + 1:
        raise StepFailed(f"{where}: {tree['width_field']} resolved to {width!r}, expected {budget + 1}",
                         evidence)
    if not got.get("report"):
        raise StepFailed(f"{where}: {'.'.join(tree['hybrid']['report'])} does not see a hybrid target",
                         evidence)
    return "; " + hybrid_words(got["report"], where, evidence)


def hybrid_words(report, where, evidence):
    """One clause for a hybrid target DDTREE serves, or StepFailed when its recurrent tree path
    is off (a tree verified as a chain) or the commit hook is missing."""
    topk = report.get("speculative_eagle_topk")
    chain = report.get("ddtree_topk") == 1  # top-K 1: the tree is a chain, no tree path needed
    if not report.get("tree_path") and not chain:
        raise StepFailed(f"{where}: speculative_eagle_topk resolved to {topk!r}, so the hybrid backend's "
                         "recurrent tree path is off and a tree would be verified as a chain", evidence)
    if not report.get("commit_hook_found"):
        raise StepFailed(f"{where}: {report.get('commit_hook')} is not in this release: the accepted node's "
                         "recurrent state would not be committed", evidence)
    path = ("top-K 1: the tree is a chain, served by the recurrent chain path" if chain else
            f"recurrent tree path on (speculative_eagle_topk {topk} > 1)")
    return (f"hybrid {report.get('recurrent_config')} ({report.get('recurrent_kind')}): {path}, accepted "
            f"node's state committed by {report.get('commit_hook')}")


def _ask_child(script, request, timeout_s, *, doing, who):
    """Run ``script`` in a fresh interpreter from a neutral working folder (so imports find
    the INSTALLED package); its last JSON line on stdout is the answer. -> (answer, output)"""
    with tempfile.TemporaryDirectory(prefix="ddtree-smoke-") as cwd:
        rc, out = _run([sys.executable, "-c", script, json.dumps(request)], timeout_s, cwd)
    if rc is None:
        raise StepFailed(f"{doing} timed out after {timeout_s:g} s", {"output": tail(out)})
    answer = _last_json_line(out)
    if answer is None:
        raise StepFailed(f"{who} exited {rc} without an answer", {"output": tail(out)})
    return answer, out


def _last_json_line(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


# ------------------------------------------------------------------------- cli

_VALIDATE_CHILD = _RELEASE_HELPERS + r"""
spec = json.loads(sys.argv[1])
try:
    args, obj = release_args(dict(spec, parse=[spec["module"], spec["function"]]), spec["argv"])
except BaseException as exc:
    print(json.dumps({"ok": False, "error": "%s: %s" % (type(exc).__name__, exc),
                      "traceback": traceback.format_exc()[-3000:]}))
    sys.exit(0)
answer = {"ok": True, "fields": {k: getattr(obj, k, None) for k in spec.get("report", [])}}
if spec.get("hybrid_report"):
    try:
        answer["hybrid"] = _get(spec["hybrid_report"])(args)
    except BaseException as exc:
        answer["hybrid_error"] = "%s: %s" % (type(exc).__name__, exc)
print(json.dumps(answer, default=str))
"""


def level_cli(spec):
    argv = [sys.executable if a == "{python}" else a for a in spec["argv"]]
    timeout_s = float(spec.get("timeout_s", 180))
    validate = spec.get("validate")
    absent = [p for p in (validate or {}).get("needs_paths", []) if not os.path.exists(p)]
    checked = {}
    worker = None
    if validate and not absent:
        # Both children import SGLang's server args (seconds each): run them side by side.
        import threading

        def check():
            try:
                checked["result"] = _validate(validate, timeout_s)
            except StepFailed as exc:
                checked["error"] = exc

        worker = threading.Thread(target=check, daemon=True)
        worker.start()
    with tempfile.TemporaryDirectory(prefix="ddtree-smoke-") as cwd:
        rc, out = _run(argv, timeout_s, cwd)
    if worker is not None:
        worker.join()
    if rc is None:
        raise StepFailed(f"{' '.join(argv[1:])} timed out after {timeout_s:g} s", {"output": tail(out)})
    if rc != 0:
        raise StepFailed(f"{' '.join(argv[1:])} exited {rc}", {"output": tail(out)})
    missing = [flag for flag in spec.get("expect", []) if flag not in out]
    if missing:
        raise StepFailed(
            "the help does not list " + ", ".join(missing), {"missing": missing, "output": tail(out)}
        )
    evidence = {"flags": spec.get("expect", [])}
    detail = f"help lists {len(evidence['flags'])} DDTree flags"
    if validate:
        if absent:
            evidence["validation"] = {"skipped": "model files not on the host: " + ", ".join(absent)}
            detail += "; ServerArgs validation skipped (model files not on the host)"
        elif "error" in checked:
            raise checked["error"]
        else:
            evidence["validation"] = checked["result"]
            detail += f"; {validate['function']} accepts the launch arguments"
            if validate.get("width"):
                detail += "; " + _judge_width(validate["width"], checked["result"])
            detail += _judge_hybrid_launch(validate, checked["result"])
    return detail, evidence


def _judge_hybrid_launch(validate, result):
    """The host's own launch arguments on a hybrid model: the recurrent tree path on."""
    if not validate.get("hybrid_report"):
        return ""
    if result.get("hybrid_error"):
        raise StepFailed(f"{'.'.join(validate['hybrid_report'])} failed on the launch arguments: "
                         f"{result['hybrid_error']}", {"validation": result})
    if not result.get("hybrid"):
        return ""  # a pure-attention model
    return "; " + hybrid_words(result["hybrid"], "the launch arguments", {"validation": result})


def _judge_width(width, result):
    """The host's own launch settings must resolve DDTREE to a verify width of budget + 1."""
    fields = result["fields"]
    budget = width.get("budget")
    if budget is None:
        budget = fields.get(width["budget_field"])
    if not isinstance(budget, int) or isinstance(budget, bool):
        raise StepFailed(f"cannot tell the DDTree budget: the inventory sets no [smoke.launch] budget and "
                         f"ServerArgs has no {width['budget_field']} (got {budget!r}); set budget in "
                         "[smoke.launch]", {"validation": result})
    found = fields.get(width["field"])
    if found != budget + 1:
        raise StepFailed(f"the launch arguments resolve {width['field']} to {found!r}, expected {budget + 1} "
                         f"({width['budget_flag']} {budget} + 1): DDTREE would not verify its tree",
                         {"validation": result})
    return f"verify width {found} = budget {budget} + 1"


def _validate(spec, timeout_s):
    """Parse and validate the launch arguments with the host's own parser, as the server would."""
    child = {k: spec[k] for k in ("module", "function", "argv")}
    child.update({k: spec[k] for k in ("plugins", "resolve", "view", "hybrid_report") if spec.get(k)})
    child["report"] = spec.get("report", [])
    name = spec["function"]
    answer, out = _ask_child(_VALIDATE_CHILD, child, timeout_s, doing=name, who=name)
    if not answer["ok"]:
        # argparse explains a bad flag on stderr before its SystemExit: keep that output.
        answer["output"] = tail(out)
        raise StepFailed(f"{name} rejects the launch arguments: {answer['error']}", answer)
    result = {"argv": spec["argv"], "fields": answer["fields"]}
    result.update({k: answer[k] for k in ("hybrid", "hybrid_error") if k in answer})
    return result


# ---------------------------------------------------------------------- launch


def level_launch(spec):
    host, port = spec.get("host", "127.0.0.1"), int(spec["port"])
    base = f"http://{host}:{port}"
    evidence = {"log_path": spec["log_path"], "argv": spec["argv"]}
    proc = server.start_server(spec, evidence, own="smoke")
    evidence["pid"] = proc.pid
    try:
        _serve_and_probe(proc, spec, base, evidence)
    except StepFailed as exc:
        exc.evidence.update(evidence)
        exc.evidence["log_tail"] = server.log_tail(spec["log_path"], int(spec.get("log_tail_lines", 40)))
        raise
    finally:
        evidence["stopped"] = server.stop_group(proc, float(spec.get("term_grace_s", 20)))
    if evidence["stopped"]["left"]:
        raise StepFailed(
            f"processes {evidence['stopped']['left']} outlived TERM and KILL of group {proc.pid}", evidence
        )
    return _launch_detail(evidence), evidence


def _serve_and_probe(proc, spec, base, evidence):
    started = time.monotonic()
    evidence["ready_by"] = server.wait_ready(proc, spec)
    evidence["ready_s"] = round(time.monotonic() - started, 2)
    prove_served(spec, base, evidence)


def prove_served(spec, base, evidence):
    """A ready server at ``base`` serves DDTree: a ``/generate`` probe with non-empty text
    (unless ``spec["probe"]`` is None), the tree prompts (``spec["tree"]["prompts"]``), then
    ``/server_info``: the algorithm, and the tree report judged (``judge_tree_report``).
    Shared by the launch level (its own server) and the serve program (the host's serving
    server, after a restart). Raises StepFailed; fills ``evidence``."""
    probe = spec.get("probe", {})
    if probe is None:  # the serve program's "width" proof: no request sent to the server
        return _server_info_proof(spec, base, evidence)
    body = {"text": probe.get("text", "The capital of France is"),
            "sampling_params": {"max_new_tokens": int(probe.get("max_new_tokens", 32)), "temperature": 0.0}}
    status, reply = server.http_request("POST", base + "/generate", body, timeout=float(spec.get("probe_timeout_s", 120)))
    if status != 200 or not isinstance(reply, dict):
        raise StepFailed(f"POST /generate answered {status}", {"reply": tail(str(reply))})
    text = reply.get("text")
    if not isinstance(text, str) or not text.strip():
        raise StepFailed("POST /generate returned empty text", {"reply": reply})
    meta = reply.get("meta_info") or {}
    evidence["probe"] = {"text": text[:200], "completion_tokens": meta.get("completion_tokens"),
                         "spec_verify_ct": meta.get("spec_verify_ct")}
    if meta.get("spec_verify_ct") and meta.get("completion_tokens") is not None:
        evidence["accept_length"] = round(meta["completion_tokens"] / meta["spec_verify_ct"], 3)
    tree = spec.get("tree")
    if tree and tree.get("prompts"):
        _tree_requests(tree, base, float(spec.get("probe_timeout_s", 120)), evidence)
        # A budget schedule: one batch per threshold, so every width verifies at least once.
        status, info = server.http_request("GET", base + "/server_info", timeout=30)
        for threshold in schedule_thresholds(info if status == 200 else None):
            _tree_requests(dict(tree, prompts=_cycled(tree["prompts"], threshold)), base,
                           float(spec.get("probe_timeout_s", 120)), evidence)
            evidence.setdefault("schedule_batches", []).append(threshold)
    _server_info_proof(spec, base, evidence)


def schedule_thresholds(info):
    """The batch thresholds of the server's --speculative-ddtree-budget-schedule ([] without
    one): THRESHOLD:BUDGET[/TOPK] entries, comma-separated (the payload's grammar; only the
    thresholds are read here)."""
    text = info.get("speculative_ddtree_budget_schedule") if isinstance(info, dict) else None
    if not isinstance(text, str):
        return []
    heads = [part.split(":", 1)[0].strip() for part in text.split(",")]
    return [int(head) for head in heads if head.isdigit()]


def _cycled(prompts, count):
    return [prompts[i % len(prompts)] for i in range(max(int(count), 1))]


def _server_info_proof(spec, base, evidence):
    tree = spec.get("tree")
    info, endpoint = None, None
    for endpoint in ("/server_info", "/get_server_info"):
        status, info = server.http_request("GET", base + endpoint, timeout=30)
        if status == 200 and isinstance(info, dict):
            break
        info = None
    if info is None:
        raise StepFailed("neither /server_info nor /get_server_info answered")
    evidence["server_info_endpoint"] = endpoint
    algorithm = info.get("speculative_algorithm")
    evidence["speculative_algorithm"] = algorithm
    expected = spec.get("expect_algorithm")
    if expected and str(algorithm).upper() != expected.upper():
        raise StepFailed(f"the server reports speculative_algorithm={algorithm!r}, not {expected}")
    states = info.get("internal_states") or [{}]
    if isinstance(states, list) and states and isinstance(states[0], dict):
        evidence["avg_spec_accept_length"] = states[0].get("avg_spec_accept_length")
    if tree:
        evidence["tree"] = judge_tree_report(tree, info, endpoint, evidence.get("tree_requests", {}))


def _tree_requests(tree, base, timeout_s, evidence):
    """Varied prompts in one batch, long enough that some verify step accepts a path off the
    first-ranked chain (the proof that a tree, not a chain, was verified)."""
    prompts = list(tree["prompts"])
    body = {"text": prompts, "sampling_params": {"max_new_tokens": int(tree.get("max_new_tokens", 256)),
                                                 "temperature": 0.0}}
    status, reply = server.http_request("POST", base + "/generate", body, timeout=timeout_s)
    if status != 200 or not isinstance(reply, list):
        raise StepFailed(f"POST /generate with {len(prompts)} prompts (the tree check) answered {status}",
                         {"reply": tail(str(reply))})
    tokens = sum(int(((r or {}).get("meta_info") or {}).get("completion_tokens") or 0) for r in reply)
    sent = evidence.setdefault("tree_requests", {"prompts": 0, "completion_tokens": 0})
    sent["prompts"] += len(prompts)
    sent["completion_tokens"] += tokens


# The keys the server reports under /server_info internal_states[i] (CONTRACTS.md).
TREE_KEYS = ("ddtree_verify_width", "ddtree_worker_class", "ddtree_offchain_accepts")


def judge_tree_report(tree, info, endpoint, sent):
    """Tree verify really ran: every scheduler's report has the verify width budget + 1 and the
    family's worker class, and at least one verify step accepted an off-chain path."""
    states = info.get("internal_states")
    where = f"{endpoint} internal_states"
    if not isinstance(states, list) or not states or not all(isinstance(s, dict) for s in states):
        raise StepFailed(f"{where}: missing or not a list of objects ({tail(repr(states), 200)}): "
                         "the server reports no tree verify state")
    budget = tree.get("budget")
    if budget is None:
        budget = info.get(tree["budget_field"])
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise StepFailed(f"{endpoint}: {tree['budget_field']} is {budget!r}, and the inventory sets no "
                             "[smoke.launch] budget: cannot tell the verify width to expect; set budget")
    for i, state in enumerate(states):
        missing = [k for k in TREE_KEYS if k not in state]
        if missing:
            raise StepFailed(f"{where}[{i}] has no {', '.join(missing)}: the deployed series does not report "
                             "its tree verify (a partial port, or a worker without the DDTree report)",
                             {"internal_states": states})
        if state["ddtree_verify_width"] != budget + 1:
            raise StepFailed(f"{where}[{i}].ddtree_verify_width is {state['ddtree_verify_width']!r}, expected "
                             f"{budget + 1} (budget {budget} + 1): the server does not verify a DDTree tree",
                             {"internal_states": states})
        expected = tree.get("worker_class")
        if not isinstance(state["ddtree_worker_class"], str) or not state["ddtree_worker_class"] or (
                expected and state["ddtree_worker_class"] != expected):
            raise StepFailed(f"{where}[{i}].ddtree_worker_class is {state['ddtree_worker_class']!r}, expected "
                             f"{expected or 'a class name'}: DDTREE is not served by the family's tree worker",
                             {"internal_states": states})
    counts = [s["ddtree_offchain_accepts"] for s in states]
    if not all(isinstance(c, int) and not isinstance(c, bool) for c in counts):
        raise StepFailed(f"{where}: ddtree_offchain_accepts is {counts!r}, not a count",
                         {"internal_states": states})
    # Off-chain accepts are asked for only where prompts were sent to make some (the serve
    # program's "width" proof sends none: a server just restarted has verified nothing yet).
    if tree.get("prompts") and sum(counts) < 1:
        raise StepFailed(f"{where}: ddtree_offchain_accepts is {sum(counts)} after the probe and "
                         f"{sent.get('prompts', 0)} more prompts ({sent.get('completion_tokens', 0)} tokens): no "
                         "verify step accepted a path off the first-ranked chain, so no tree verify was "
                         "seen", {"internal_states": states})
    judged = {"verify_width": budget + 1, "budget": budget, "worker_class": states[0]["ddtree_worker_class"],
              "offchain_accepts": sum(counts)}
    schedule = _judge_schedule(tree, states, where, sent)
    if schedule:
        judged["schedule"] = schedule
    return judged


def _judge_schedule(tree, states, where, sent):
    """A budget schedule's report (``ddtree_schedule`` beside the three keys): every entry's
    verify width is its budget + 1 and, where batches were sent for it, every width verified
    at least one step. [] without a schedule."""
    out = []
    for i, state in enumerate(states):
        entries = state.get("ddtree_schedule")
        if entries is None:
            continue
        for entry in entries if isinstance(entries, list) else [entries]:
            if not isinstance(entry, dict) or entry.get("verify_width") != (entry.get("budget") or 0) + 1:
                raise StepFailed(f"{where}[{i}].ddtree_schedule entry {entry!r}: its verify width is not its "
                                 "budget + 1", {"internal_states": states})
            steps = entry.get("steps")
            if tree.get("prompts") and (not isinstance(steps, int) or steps < 1):
                raise StepFailed(f"{where}[{i}].ddtree_schedule: the entry from batch {entry.get('threshold')} "
                                 f"(width {entry['verify_width']}) verified {steps!r} steps after "
                                 f"{sent.get('prompts', 0)} prompts: not every width of the schedule ran",
                                 {"internal_states": states})
            out.append({key: entry.get(key) for key in
                        ("threshold", "verify_width", "steps", "mean_accept_length")})
    return out


def _launch_detail(evidence):
    parts = [f"ready in {evidence['ready_s']} s ({evidence['ready_by']})"]
    if evidence.get("speculative_algorithm"):
        parts.append(f"algorithm {evidence['speculative_algorithm']}")
    if evidence.get("accept_length") is not None:
        parts.append(f"accept length {evidence['accept_length']}")
    if evidence.get("avg_spec_accept_length") is not None:
        parts.append(f"avg_spec_accept_length {evidence['avg_spec_accept_length']}")
    if evidence.get("tree"):
        parts.append(tree_line(evidence["tree"]))
    return ", ".join(parts)


def tree_line(tree):
    """A judged tree report (``judge_tree_report``) as the words every level and restart
    detail ends with: the smoke launch, the serve restart and the container start say it
    alike."""
    line = (f"DDTREE verify width {tree['verify_width']} = budget {tree['budget']} + 1, "
            f"{tree['worker_class']}, {tree['offchain_accepts']} off-chain accepts")
    if tree.get("schedule"):
        line += (", schedule widths " + "/".join(str(e["verify_width"]) for e in tree["schedule"])
                 + " ran " + "/".join(str(e["steps"]) for e in tree["schedule"]) + " steps")
    return line


# ------------------------------------------------------------------------ main

LEVELS = {"compile": level_compile, "import": level_import, "cli": level_cli, "launch": level_launch}
LOG_COPY_CHARS = 1 << 20  # the server log shipped back on a failed launch: its last MiB


def run(request, emitter=None):
    results, failed = [], False
    for name in request["levels"]:
        if failed:
            result = {"level": name, "ok": False, "status": "skipped", "seconds": 0.0,
                      "detail": "skipped: an earlier level failed", "evidence": {}}
        else:
            started = time.monotonic()
            if emitter:
                emitter.current, emitter.started = name, started
                emitter.emit({"event": "start", "level": name})
            try:
                detail, evidence = LEVELS[name](request.get(name) or {})
                status = "passed"
            except StepFailed as exc:
                detail, evidence, status, failed = exc.detail, exc.evidence, "failed", True
            except Exception as exc:  # an agent bug must still answer JSON, not a traceback
                detail, evidence, status, failed = "%s: %s" % (type(exc).__name__, exc), {}, "failed", True
            result = {"level": name, "ok": status == "passed", "status": status,
                      "seconds": round(time.monotonic() - started, 3), "detail": detail,
                      "evidence": evidence}
        results.append(result)
        if emitter:
            emitter.current = None
            emitter.emit(dict(result, event="level"))
    answer = {"event": "done", "ok": not failed, "python": sys.executable, "levels": results}
    launch = request.get("launch")
    if launch and any(r["level"] == "launch" and r["status"] == "failed" for r in results):
        answer["server_log"] = _read_log(launch["log_path"])
    return answer


def _read_log(path):
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - LOG_COPY_CHARS))
            return fh.read().decode("utf-8", "replace")
    except OSError:
        return None


def _check(request):
    unknown = [n for n in request["levels"] if n not in LEVELS]
    return "unknown levels: %s" % unknown if unknown else None


def main(argv=None):
    """Read one request line (stdin, or the file named by the only argument); stream the answer.

    Run as a file, or shipped like the deploy agent: ``python -c BOOTSTRAP`` reads this
    program (bundle.py) from stdin, then ``main()`` reads the request line that follows it.
    """
    # A dropped connection must not orphan a server: hangups and broken pipes are ignored
    # (wire.one_request), the level finishes (every wait has a deadline) and stops the group.
    request = wire.one_request(argv, _check)
    if request is None:
        return 2
    for spec in request.values():
        if isinstance(spec, dict) and spec.get("log_path"):
            spec["log_path"] = os.path.expanduser(spec["log_path"])
    emitter = wire.Emitter(sys.stdout.buffer, float(request.get("heartbeat_s", wire.HEARTBEAT_S)))
    try:
        emitter.emit(run(request, emitter))
    finally:
        emitter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
