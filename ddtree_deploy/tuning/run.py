"""`tune`'s I/O: the host checks, the sweep over one host-program session, the results file.

The decisions (grid, pruning, choice, table) are ``tune.py``'s; this module asks the
host (``status.status``: is DDTree deployed, by which family), builds each launch's argv
from the host's ``[smoke.launch]`` settings with the launch smoke's own template code
(``smoke_plan.launch_argv``), ships ``hostprog/tune.py`` (with the server lifecycle,
``hostprog/server.py``) to the host, and streams each finished configuration into the local
results file.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

from ddtree_deploy.base import next_step
from ddtree_deploy.base.codes import Code, Phase
from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.fsutil import require_writable_folder
from ddtree_deploy.base.progress import Heartbeat, Progress, quiet
from ddtree_deploy.remote.program import HostProgram, ProgramSession
from ddtree_deploy.settings import smoke as smoke_settings
from ddtree_deploy.smoke import plan as smoke_plan
from ddtree_deploy.tuning import prompts, tune

# SGLang's serving benchmark: ``sglang.benchmark.serving`` from 0.5.15 on (``sglang.bench_serving``
# is then a shim that warns it will be removed: 0.5.23), ``sglang.bench_serving`` before.
# Chosen from the release's files (``bench_module``), as the host program finds them installed.
BENCH_MODULES = (("sglang/benchmark/serving.py", "sglang.benchmark.serving"),
                 ("sglang/bench_serving.py", "sglang.bench_serving"))
BENCH_MODULE = "sglang.bench_serving"  # the module every release since 0.5.11 has (the shim, lately)
# 0.5.12.post1's `--dataset-name random` samples ShareGPT text (and downloads it when no
# --dataset-path is given); `random-ids` is random token ids, offline. The prompts depend
# only on --seed, the lengths and the tokenizer: the same for every configuration.
OFFLINE_DATASET = "random-ids"
# Failures of the host, not of the configuration: every later launch would fail the same
# way (or measure something else), so the sweep stops (exit 1) and keeps what it has.
STOPPERS = (Code.SERIES_CHANGED, Code.LOCKED, Code.PORT, Code.GPU, Code.LEFT_RUNNING)


def _num(x) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) and not isinstance(x, bool) else "?"


@dataclass(frozen=True)
class Target:
    """What the sweep needs to know about the host before it launches anything."""

    launch: smoke_settings.LaunchSettings
    family: smoke_settings.FamilySmoke
    series: dict  # the status document's series entry
    sglang_version: str | None


def check_host(host, *, apply: bool) -> smoke_settings.LaunchSettings:
    """Local checks (no connection): the inventory's launch settings can drive a tune."""
    if apply and host.source is None:
        raise BadInput(f"--apply: host {host.name!r} has no inventory file to write the choice into; "
                       "use an inventory file (hosts/<name>.toml)")
    settings = smoke_settings.parse_settings(host.smoke, source=host.source)
    where = host.source or "<inventory>"
    launch = settings.launch
    if launch is None:
        raise BadInput(f"{where}: no [smoke.launch] table: tune launches the server with those settings "
                       "(model, draft_model, port...); add one (see docs/smoke.md)")
    if launch.model is None and launch.command is None:
        raise launch.bad("smoke.launch.model", "missing (tune serves that model)",
                         'add model = "/path/to/model" to [smoke.launch]', source=where)
    if launch.command is not None:
        joined = " ".join(launch.command)
        for name in ("budget", "topk"):
            if "{%s}" % name not in joined:
                raise launch.bad("smoke.launch.command", f"has no {{{name}}} placeholder, so tune cannot set the {name}",
                                 "add it to the command template", source=where)
    return launch


def inspect_host(host, make_transport, *, patches_dir=None, progress: Progress = quiet) -> Target:
    """Ask the host what is deployed: DDTree must be, by a family known here."""
    from ddtree_deploy.engine.series import known_family, load_family, no_such_family
    from ddtree_deploy.session import status

    launch = smoke_settings.parse_settings(host.smoke, source=host.source).launch
    progress("read the host's journal")
    doc = status.status(host, make_transport())
    if doc["phase"] != Phase.DEPLOYED or not doc["series"]:
        raise BadInput(f"{host.name}: no DDTree deployed (phase {doc['phase']}): tune measures a deployed "
                       f"series; push it first: {next_step.push(host.name)}")
    name = doc["series"]["name"]
    # (the toolkit's families and the user's own, unless the caller names a folder)
    folder = known_family(name, Path(patches_dir) if patches_dir else None)
    if folder is None:
        raise BadInput(f"{host.name}: the host's journal names a series that is not here: "
                       f"{no_such_family(str(name), Path(patches_dir) if patches_dir else None)}",
                       hint="tune from a checkout that has that family under patches/")
    family = smoke_settings.family_smoke(load_family(folder))
    lock = doc.get("lock")
    if lock:
        raise DeployError(f"{host.name}: a {lock.get('command') or 'push/rollback'} holds the deploy lock "
                          f"(holder {lock.get('holder')}, since {lock.get('time')}, run {lock.get('run_id')}): "
                          "tune waits for it to finish", code=Code.LOCKED,
                          hint=next_step.status(host.name))
    return Target(launch=launch, family=family, series=doc["series"], sglang_version=doc.get("sglang_version"))


# ------------------------------------------------------------------ argv for one launch


def _drop_flags(argv: Sequence[str], drop: Callable[[str], bool]) -> list[str]:
    """argv without the options ``drop`` names, and their values (``--f v`` or ``--f=v``)."""
    out, skip = [], False
    for i, arg in enumerate(argv):
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if arg.startswith("--") and drop(name):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            skip = "=" not in arg and nxt is not None and not nxt.startswith("--")
            continue
        out.append(arg)
    return out


def launch_argv(target: Target, config: tune.Config, *, source: str | None = None) -> list[str]:
    """The server argv for one configuration: the launch smoke's template, filled.

    DDTree: the host's settings with this budget and top-K. The DFlash chain: the same
    with ``--speculative-algorithm DFLASH`` and no DDTree flag. No speculation: every
    ``--speculative-*`` option removed (the draft model too).
    """
    fam = target.family
    if config.kind == "ddtree":
        return smoke_plan.launch_argv(replace(target.launch, budget=config.budget, topk=config.topk,
                                              budget_schedule=None), source=source, family=fam)
    # (a schedule the inventory holds never reaches a sweep's launch: each measures one tree)
    filled = smoke_plan.launch_argv(replace(target.launch, budget=target.launch.budget or 1,
                                            topk=target.launch.topk or 1, budget_schedule=None),
                                    source=source, family=fam)
    if config.kind == "dflash":
        argv = _drop_flags(filled, lambda f: f in (fam.budget_flag, fam.topk_flag)
                           or f.startswith("--speculative-ddtree-"))
        for i, arg in enumerate(argv):
            if arg == "--speculative-algorithm" and i + 1 < len(argv):
                argv[i + 1] = "DFLASH"
            elif arg.startswith("--speculative-algorithm="):
                argv[i] = "--speculative-algorithm=DFLASH"
        return argv
    return _drop_flags(filled, lambda f: f.startswith("--speculative-") or f in (fam.budget_flag, fam.topk_flag))


def bench_module(files: Iterable[str]) -> str:
    """The benchmark module a release runs, from its files (a wheel's names, or what the
    tune program found installed): the newest of BENCH_MODULES it ships."""
    present = set(files)
    for path, module in BENCH_MODULES:
        if path in present:
            return module
    raise DeployError("the host's SGLang ships no serving benchmark (neither "
                      + " nor ".join(p for p, _ in BENCH_MODULES) + "): tune cannot measure it",
                      code=Code.FAILED, hint="install a complete SGLang release on the host")


def bench_argv(launch: smoke_settings.LaunchSettings, opts: tune.TuneOptions,
               module: str = BENCH_MODULE) -> list[str]:
    """SGLang's own benchmark on the host (``--max-concurrency`` and ``--output-file`` are
    added per run by the host program; with a prompt file, each category's dataset and
    prompt count too: ``category_runs``). Fixed seed and lengths: the same prompts for every
    configuration; ``--flush-cache`` so no run profits from the previous one's prefix cache."""
    argv = server_bench_argv(launch.host, launch.port, module, seed=opts.seed, model=launch.model)
    if opts.dataset == "prompts":
        return argv + prompts_dataset_args(opts.output_len)
    argv += ["--num-prompts", str(opts.requests), "--random-input-len", str(opts.input_len),
             "--random-output-len", str(opts.output_len), "--random-range-ratio", "1.0"]
    if opts.dataset == "sharegpt-file":
        argv += ["--dataset-name", "random", "--dataset-path", str(opts.dataset_path)]
    else:
        argv += ["--dataset-name", OFFLINE_DATASET, "--tokenize-prompt"]
    return argv


def server_bench_argv(host: str, port: int, module: str = BENCH_MODULE, *, seed: int = 1,
                      model: str | None = None, tokenizer: str | None = None) -> list[str]:
    """SGLang's serving benchmark against the server at ``host:port``, without its dataset:
    what tune's runs and the speed gate's load step (serve/loadstep.py) share. Without
    ``model`` the benchmark asks the server's ``/v1/models``."""
    argv = ["{python}", "-m", module, "--backend", "sglang", "--host", host,
            "--port", str(port), "--seed", str(seed), "--request-rate", "inf",
            "--flush-cache", "--disable-tqdm", "--ready-check-timeout-sec", "0", "--warmup-requests", "1"]
    if model is not None:
        argv += ["--model", model]
    if tokenizer is not None:
        argv += ["--tokenizer", tokenizer]
    return argv


def prompts_dataset_args(output_len: int) -> list[str]:
    """SGLang's "custom" dataset: the operator's prompts (``prompt_files``: each file's
    ``--dataset-path`` and ``--num-prompts`` are given per run), each answered with
    ``output_len`` tokens."""
    return ["--dataset-name", "custom", "--sharegpt-output-len", str(output_len)]


def prompt_folder(state: str, run_id: str) -> str:
    return f"{state}/tune/{run_id}/prompts"


def prompt_files(sample: prompts.PromptSample, folder: str) -> list[dict]:
    """Each category's prompts as the benchmark's ``custom`` dataset file, to write on the host."""
    return [{"path": f"{folder}/{i}.jsonl", "text": prompts.custom_lines(texts)}
            for i, (_, texts) in enumerate(sample.by_category().items())]


def category_runs(opts: tune.TuneOptions, folder: str) -> list[dict]:
    """One benchmark run per category at each concurrency: its file and its prompt count."""
    return [{"category": c, "requests": n, "args": ["--dataset-path", f"{folder}/{i}.jsonl", "--num-prompts", str(n)]}
            for i, (c, n) in enumerate(opts.categories)]


def expected_algorithm(config: tune.Config) -> str | None:
    return {"ddtree": smoke_plan.ALGORITHM, "dflash": "DFLASH", "none": None}[config.kind]


# ------------------------------------------------------------------ the host program


# The tune program uses the server lifecycle the launch smoke level uses (hostprog/server.py:
# GPU check, port check, HTTP, server start and readiness, process-group stop): shipped with it
# (hostprog.bundle).
TUNE_PROGRAM = HostProgram("ddtree_deploy.hostprog.tune", "the tune program", "tune-agent")


# How long the controller waits for the tune program, step by step, seen from this side of
# the link: the smoke's rule (smoke_plan: the sum of the host's own deadlines inside a step,
# plus its slack), applied to one `run` request's steps. Every step may end with the
# server's stop (TERM, term_grace_s, then KILL): each includes it.
BENCH_STOP_S = 5.0 + smoke_plan.KILL_S  # hostprog.tune._bench: stop_group(child, 5.0) of an overdue bench


def run_deadlines(request: Mapping) -> dict[str, float]:
    """Seconds the controller waits for each step of one ``run`` request (pure):
    ``launch`` (start, readiness), ``bench`` (one concurrency's bench_serving run, its
    own ``timeout_s``) and ``end`` (the server's /server_info, then its stop)."""
    stop = float(request.get("term_grace_s", 30)) + smoke_plan.KILL_S
    slack = smoke_plan.LEVEL_SLACK_S
    bench = request.get("bench") or {}
    runs = max(1, len(bench.get("runs") or ()))  # a prompt file: one benchmark run per category
    probe = float((request.get("probe") or {}).get("timeout_s", 0)) * len((request.get("probe") or {}).get("prompts")
                                                                            or ())
    return {
        "launch": (smoke_plan.NVIDIA_SMI_S + float(request.get("ready_timeout_s", 900))
                   + smoke_plan.HEALTH_POLL_S + stop + slack),
        "bench": runs * (float(bench.get("timeout_s", 3600)) + BENCH_STOP_S) + stop + slack,
        "end": probe + smoke_plan.SERVER_INFO_S + stop + slack,
    }


@dataclass(frozen=True)
class Step:
    """What the controller is waiting for now: its name in messages, its kind (a key of
    ``run_deadlines``) and when it started (time.monotonic)."""

    what: str
    kind: str
    started: float


#: How long a Ctrl-C waits for the tune program's word that the server stopped, at most.
INTERRUPT_WAIT_S = 0.2


class Session:
    """One host-program session: begin (locks), run per configuration, end.

    Every read has a deadline: the running step's (``run_deadlines``, or ``deadlines``
    where given), and no more than ``smoke_plan.silence_limit`` without a line while a
    configuration runs (the tune program beats every ``heartbeat_s``, sent with ``begin``).
    A missed one is one error naming the host, the step and the seconds (code ``timeout``);
    the program is left to stop what it started (it takes the hangup as an abort).
    """

    def __init__(self, host, transport, *, progress: Progress = quiet,
                 heartbeat: Heartbeat | None = None,
                 heartbeat_s: float = smoke_plan.HEARTBEAT_S, deadlines: Mapping[str, float] | None = None):
        self.host, self.transport, self.progress, self.heartbeat = host, transport, progress, heartbeat
        self.program: ProgramSession | None = None
        self.beat = {"heartbeat_s": heartbeat_s}  # what the tune program is told (begin), the silence rule's input
        self.deadlines = dict(deadlines or {})

    @property
    def proc(self):
        return self.program.proc if self.program is not None else None

    def __enter__(self):
        self.transport.__enter__()
        try:
            self.program = ProgramSession(self.transport, self.host, TUNE_PROGRAM).__enter__()
        except BaseException:
            self.transport.__exit__(None, None, None)
            raise
        return self

    def send(self, doc: dict) -> None:
        self.program.send(doc, during=f"while sending {doc.get('op')}")

    def begin(self, request: dict) -> dict:
        """Send ``begin`` (with the heartbeat interval); its answer within smoke_plan.START_S."""
        self.send({**request, **self.beat})
        limit = smoke_plan.START_S
        try:
            return self.read(("ready", "refused"), deadline=time.monotonic() + limit)
        except TimeoutError:
            raise self._missed(Step("the tune program's start (taking the tune lock)", "begin", 0.0),
                               limit, silent=False) from None

    def run(self, request: dict) -> dict:
        """Send one ``run`` request and read its result, step by step within their deadlines."""
        limits = {**run_deadlines(request), **self.deadlines}
        silence = smoke_plan.silence_limit(self.beat)
        key = request["key"]
        concurrency = list((request.get("bench") or {}).get("concurrency") or ())
        step = Step(f"launch of {key}", "launch", time.monotonic())
        self.send(request)
        while True:
            limit = limits[step.kind]
            try:
                doc = self.read(("result", "phase"), deadline=step.started + limit, silence=silence)
            except TimeoutError:
                raise self._missed(step, limit, silent=time.monotonic() < step.started + limit,
                                   silence=silence) from None
            if doc.get("event") == "result":
                return doc
            # A phase ended: the next step's clock starts now.
            if doc.get("what") == "measured":
                measured = (doc.get("measure") or {}).get("concurrency")
                done = concurrency.index(measured) + 1 if measured in concurrency else len(concurrency)
            else:  # "ready": the server is up, the bench runs begin
                done = 0
            if done < len(concurrency):
                step = Step(f"bench of {key} at concurrency {concurrency[done]}", "bench", time.monotonic())
            else:
                step = Step(f"the end of {key} (server info, server stop)", "end", time.monotonic())

    def read(self, until: Sequence[str], deadline: float | None = None, silence: float | None = None) -> dict:
        """The next event named in ``until`` (heartbeats and phases reported on the way);
        TimeoutError when no line comes by ``deadline`` (time.monotonic), or none for
        ``silence`` seconds: each line read, a heartbeat too, starts the silence anew (a step
        longer than the silence limit, heartbeating all along, is not a silent one)."""
        while True:
            limit = deadline
            if silence is not None:
                limit = time.monotonic() + silence if limit is None else min(limit, time.monotonic() + silence)
            doc = self.program.read(limit, what=" or ".join(until), during="the sweep")
            event = doc.get("event")
            if event == "wait" and self.heartbeat is not None:
                self.heartbeat(str(doc.get("level")), float(doc.get("seconds") or 0))
            elif event == "phase":
                what = doc.get("what")
                if what == "measured":
                    m = doc.get("measure") or {}
                    self.progress(f"{doc['key']}: concurrency {m.get('concurrency')}: {_num(m.get('output_tps'))} "
                                  f"tok/s, ITL p99 {_num(m.get('itl_p99_ms'))} ms")
                else:
                    self.progress(f"{doc['key']}: server ready in {doc.get('seconds')} s")
            if event in until:
                return doc

    def _missed(self, step: Step, limit: float, *, silent: bool, silence: float = 0.0) -> DeployError:
        """One line for a missed deadline (host, step, seconds); the link is let go, and the
        tune program, seeing it close, stops the server it started and releases its lock."""
        if self.program is not None:
            self.program.detach()
        name, where = self.host.name, self.host.source or "the inventory"
        after = (f"the tune program stops what it started by itself; the results file keeps every "
                 f"finished run: {next_step.command('tune', '--host', name, '--resume')} (with the same "
                 f"options) continues the sweep; then {next_step.status(name)}")
        if silent:
            return DeployError(
                f"{name}: tune: {step.what}: no word from the host for {silence:g} s (the tune program sends a "
                f"heartbeat every {self.beat['heartbeat_s']:g} s): the link or the program is stuck",
                code=Code.TIMEOUT, hint=f"check the host answers; {after}")
        fix = {"launch": f"raise ready_timeout_s in [smoke.launch] of {where} if the server is just slow to "
                         "start; ",
               "bench": f"raise probe_timeout_s in [smoke.launch] of {where} if the benchmark is just slow "
                        "(a bench run may take 4 x probe_timeout_s, 600 s at least); ",
               "end": f"raise term_grace_s in [smoke.launch] of {where} if the server is just slow to stop; ",
               }.get(step.kind, "the host may be overloaded; ")
        return DeployError(f"{name}: tune: {step.what} did not finish within {limit:g} s", code=Code.TIMEOUT,
                           hint=fix + after)

    def interrupt(self, grace_s: float = INTERRUPT_WAIT_S) -> dict | None:
        """Ctrl-C: ask the host program to stop the server, wait for its word at most ``grace_s``
        (the user gets the prompt back within a second), close. The program stops the server and
        releases the tune lock whether or not its word came (it takes the end of its input as
        an abort too)."""
        if self.proc is None:
            return None
        try:
            self.send({"op": "abort"})
            deadline = time.monotonic() + grace_s
            while True:
                doc = self.program.read(deadline, "the stop confirmation")
                if doc.get("event") in ("result", "bye"):
                    return doc
        except (DeployError, TimeoutError, ValueError, KeyboardInterrupt):
            return None

    def __exit__(self, *exc):
        try:
            if self.proc is not None:
                try:
                    self.send({"op": "end"})
                except DeployError:
                    pass
            if self.program is not None:
                self.program.__exit__(*exc)  # Ctrl-C: the link is dropped, never waited on
                self.program = None
        finally:
            self.transport.__exit__(*exc)


# ------------------------------------------------------------------ the sweep


@dataclass
class TuneOutcome:
    host: str
    opts: tune.TuneOptions
    records: list
    results_path: Path
    plot_path: Path | None = None
    plot_note: str | None = None
    apply: dict | None = None
    resumed: int = 0
    stopped: str | None = None  # why the sweep stopped early (lock taken, series changed)

    @property
    def choice(self) -> tune.Choice:
        return tune.choose(self.opts, self.records)

    def to_json(self) -> dict:
        return {"host": self.host, "results": str(self.results_path),
                "plot": str(self.plot_path) if self.plot_path else None, "plot_note": self.plot_note,
                "resumed": self.resumed, "stopped": self.stopped, **tune.summary(self.opts, self.records),
                "apply": self.apply}


def default_out(host_name: str) -> Path:
    return Path("tune-results") / host_name


def append_record(path: Path, record: tune.Record) -> None:
    """One line per finished configuration, flushed and synced: a kill loses at most the
    configuration that was running."""
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record.to_json()) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def tune_host(host, make_transport, opts: tune.TuneOptions, *, out_dir: Path | None = None,
              resume: bool = False, yes: bool = False, apply: bool = False, apply_as: str = "auto",
              patches_dir=None,
              progress: Progress = quiet, heartbeat=None, heartbeat_s: float = smoke_plan.HEARTBEAT_S,
              deadlines: Mapping[str, float] | None = None,
              sample: prompts.PromptSample | None = None) -> TuneOutcome:
    """Run (or resume) the sweep on ``host``; the results file grows as configurations end.

    ``heartbeat_s``: how often the tune program beats during a run (the silence limit
    follows from it); ``deadlines``: seconds per step kind, replacing ``run_deadlines``'s;
    ``sample``: the prompt file ``opts`` was made from (``opts.dataset == "prompts"``);
    ``apply_as``: what ``apply`` writes (tune_apply.decide: auto, schedule, budget)."""
    from ddtree_deploy.session import agent_link
    from ddtree_deploy.tuning.apply import check_apply_as

    tune.check_options(opts, yes=yes)
    check_apply_as(apply_as)
    check_host(host, apply=apply)
    out_dir = Path(out_dir) if out_dir is not None else default_out(host.name)
    require_writable_folder(out_dir, "--out")  # before any connection: a bad folder is bad input
    results = out_dir / "results.jsonl"
    if results.exists() and not resume:
        raise BadInput(f"{results}: a results file is already there: pass --resume to continue that sweep, "
                       "or --out another folder")
    target = inspect_host(host, make_transport, patches_dir=patches_dir, progress=progress)
    if apply and apply_as == "schedule" and target.family.schedule_flag is None:
        # Known only now (the family is the deployed series'): still before anything launches.
        raise BadInput(f"--apply-as schedule: {host.name} runs {target.series.get('name')}, whose server takes no "
                       "budget schedule (the v2 family, SGLang 0.5.20 - 0.5.23, does); nothing launched",
                       hint="use --apply-as budget (or auto) to write the one budget")
    launch = target.launch
    identity = {"series": target.series.get("name"), "series_id": target.series.get("id"),
                "sglang": target.sglang_version, "model": launch.model, "draft_model": launch.draft_model,
                "extra_args": list(launch.extra_args), "command": list(launch.command or ())}
    head = tune.header(host.name, opts, identity)
    records = tune.load_results(results, head) if resume else []
    resumed = len(records)
    if resumed:
        progress(f"resume: {resumed} finished run(s) in {results}")
    run_id = agent_link.new_run_id()
    state = host.state_dir.rstrip("/")
    folder = prompt_folder(state, run_id)
    if opts.dataset == "prompts" and sample is None:
        raise BadInput("--prompts: the prompt sample was not read")  # a caller's slip: nothing sent
    stopped = None
    with Session(host, make_transport(), progress=progress, heartbeat=heartbeat, heartbeat_s=heartbeat_s,
                 deadlines=deadlines) as sess:
        begun = sess.begin({"op": "begin", "state_dir": host.state_dir, "run_id": run_id,
                            "holder": agent_link.holder_name(), "series_id": target.series.get("id"),
                            "dataset_path": opts.dataset_path if opts.dataset == "sharegpt-file" else None,
                            "prompt_files": prompt_files(sample, folder) if opts.dataset == "prompts" else None})
        if begun["event"] == "refused":
            if begun.get("code") == Code.BAD_DATASET:
                raise BadInput(f"{host.name}: {begun['message']}")
            holder = begun.get("holder") or {}
            raise DeployError(f"{host.name}: {begun['message']} (holder {holder.get('holder')}, since "
                              f"{holder.get('time')}, run {holder.get('run_id')}): tune refused, nothing launched",
                              code=begun.get("code") or Code.LOCKED, hint=next_step.status(host.name))
        # Only now, with the host's locks held, does anything get written here: a refusal
        # (bad dataset path, a lock) leaves no results file behind.
        out_dir.mkdir(parents=True, exist_ok=True)
        if not results.exists() or not results.read_text(encoding="utf-8").strip():
            results.write_text(json.dumps(head) + "\n", encoding="utf-8")
        if begun.get("took_over"):
            progress(f"took over a stale tune lock (run {begun['took_over'].get('run_id')}: its process is gone)")
        files = [path for path, there in (begun.get("bench_files") or {}).items() if there]
        module = bench_module(files) if begun.get("bench_files") is not None else BENCH_MODULE
        progress(f"benchmark: python -m {module}; {opts.dataset_label}")
        bench = bench_argv(launch, opts, module)
        runs = category_runs(opts, folder) if opts.dataset == "prompts" else None
        while True:
            step = tune.next_step(opts, records)
            if step is None:
                break
            c = step.config
            progress(f"{c.key}: launch ({step.stage}{': ' + step.why if step.why and step.stage != 'baseline' else ''})")
            tag = f"{c.key}-r{step.repeat}" if step.repeat else c.key
            request = {"op": "run", "key": c.key, "argv": launch_argv(target, c, source=host.source),
                       "host": launch.host, "port": launch.port,
                       "log_path": f"{state}/tune/{run_id}/{tag}.server.log", "gpu_check": launch.gpu,
                       "min_free_mib": int(launch.min_free_gib * 1024), "ready_timeout_s": launch.ready_timeout_s,
                       "term_grace_s": launch.term_grace_s, "expect_algorithm": expected_algorithm(c),
                       "requests": opts.requests,
                       "bench": {"argv": bench, "concurrency": list(opts.concurrency),
                                 "timeout_s": max(600.0, launch.probe_timeout_s * 4),
                                 "out_dir": f"{state}/tune/{run_id}/bench-{tag}", "runs": runs},
                       # Each category's accept length on its own prompts (not without speculation).
                       "probe": ({"prompts": prompts.probe_texts(sample, opts.probe_prompts),
                                  "max_new_tokens": min(opts.output_len, 256),
                                  "timeout_s": max(60.0, launch.probe_timeout_s)}
                                 if runs and c.kind != "none" else None)}
            try:
                answer = sess.run(request)
            except KeyboardInterrupt:
                progress("interrupted: stopping the server on the host")
                done = sess.interrupt()
                if done is None or done.get("event") != "result":
                    progress("the host program stops the server and releases the tune lock on its own (it "
                             "sees the link close)")
                raise
            record = _record(step, answer)
            append_record(results, record)
            records.append(record)
            if record.ok:
                m = record.at(opts.choose_at)
                progress(f"{c.key}: done in {record.seconds:.0f} s"
                         + (f", {m.output_tps:.1f} tok/s at concurrency {m.concurrency}" if m else ""))
            else:
                progress(f"{c.key}: FAILED ({record.error}); the sweep goes on")
            if answer.get("code") in STOPPERS:
                stopped = record.error
                break
    if records:
        with open(results, "a", encoding="utf-8") as fh:  # load_results reads "run" lines only
            fh.write(json.dumps(tune.summary_line(opts, records)) + "\n")
    outcome = TuneOutcome(host=host.name, opts=opts, records=records, results_path=results, resumed=resumed,
                          stopped=stopped)
    _plot(outcome, out_dir)
    if apply and stopped is None:
        outcome.apply = apply_choice(host, opts, records, target, apply_as)
    return outcome


def _record(step: tune.Step, answer: dict) -> tune.Record:
    ok = answer.get("status") == "ok"
    error = answer.get("error")
    return tune.Record(config=step.config, stage=step.stage, status="ok" if ok else "failed", repeat=step.repeat,
                       measures=tuple(tune.Measure.from_json(m) for m in answer.get("measures") or ()),
                       accept_length=answer.get("accept_length"), accept_histogram=answer.get("accept_histogram"),
                       error=None if ok else (error or "failed"), seconds=float(answer.get("seconds") or 0),
                       log=answer.get("log"), category_accept=answer.get("category_accept"))


def _plot(outcome: TuneOutcome, out_dir: Path) -> None:
    try:
        from ddtree_deploy.tuning.plot import plot_png
    except ImportError as exc:  # matplotlib is the optional [tune] extra
        from ddtree_deploy.base.install import add_extra

        outcome.plot_note = f"no plot: {exc.name or 'matplotlib'} is not installed (install it: {add_extra('tune')})"
        return
    outcome.plot_path = plot_png(outcome.opts, outcome.records, out_dir / "tune.png", title=outcome.host)


def apply_choice(host, opts: tune.TuneOptions, records, target: Target, apply_as: str = "auto") -> dict:
    """Write the sweep's result into the host's inventory (tune_apply.decide: the schedule or the
    one budget), and say exactly what changed, why that form, and what the schedule could not carry."""
    from ddtree_deploy.tuning.apply import apply_launch, decide

    plan, choice = tune.plan(opts, records), tune.choose(opts, records)
    decision = decide(apply_as, plan, choice, schedule_flag=target.family.schedule_flag,
                      family=str(target.series.get("name")))
    said = {"apply_as": apply_as, "why_as": decision.why, "notes": list(plan.notes) if decision.write == "schedule"
            else []}
    if decision.write == "nothing":
        return {"written": False, "why": decision.why, "as": None, **said}
    if decision.write == "schedule":
        return {**apply_launch(Path(host.source), schedule=plan.text), **said}
    return {**apply_launch(Path(host.source), budget=choice.best.budget, topk=choice.best.topk), **said}
