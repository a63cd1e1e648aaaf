"""`ddtree-deploy tune --host H`: which DDTree budget and top-K serve fastest there.

Thin: parse the options (``tune.py`` checks them), run the sweep (``tune_run``), print the
ranked table, the choice with its margin and noise, the plot's path and, with
``--apply``, the inventory diff. Progress on stderr; the table and choice (or one JSON
document) on stdout. Exit 0 when the sweep ran (failed configurations are recorded in
the results, not fatal), 1 when the host refused or failed, 2 on bad input.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.cli.app import app, emit_host, err, handles_errors, out, say
from ddtree_deploy.cli.options import inventory_option
from ddtree_deploy.cli.text import plain, safe
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.settings.container import refuse_container
from ddtree_deploy.settings.inventory import load_host
from ddtree_deploy.tuning import tune
from ddtree_deploy.tuning.apply import check_apply_as


def _ints(text: str, option: str, what: str, hi: int) -> tuple[int, ...]:
    return tune.parse_ints(text, option, lo=1, hi=hi, what=what)


@app.command("tune")
@handles_errors
def tune_cmd(
    host: str = typer.Option(..., "--host", "-H", help="inventory name (NAME.toml in the inventory folder) or "
                                                       "a .toml path"),
    inventory: Optional[Path] = inventory_option(),
    budgets: str = typer.Option(",".join(map(str, tune.DEFAULT_BUDGETS)), "--budgets",
                                help="DDTree budgets to try (tree nodes per request), comma-separated"),
    topk: str = typer.Option(",".join(map(str, tune.DEFAULT_TOPK)), "--topk",
                             help="per-depth top-K values to try, comma-separated"),
    concurrency: str = typer.Option(",".join(map(str, tune.DEFAULT_CONCURRENCY)), "--concurrency",
                                    help="bench_serving --max-concurrency values, each measured per launch"),
    baseline: str = typer.Option("dflash,none", "--baseline",
                                 help="baselines to measure: dflash (the DFlash chain), none (no speculation); "
                                      "the first is the choice rule's reference"),
    requests: int = typer.Option(200, "--requests", help="prompts per benchmark run (bench_serving --num-prompts)"),
    input_len: int = typer.Option(1024, "--input-len", help="prompt length in tokens"),
    output_len: int = typer.Option(512, "--output-len", help="output length in tokens"),
    prompts_file: Optional[Path] = typer.Option(None, "--prompts",
                                                help="the operator's prompt sample (this machine): JSONL of "
                                                     "prompts or chat messages with an optional \"category\", or "
                                                     "SGLang request dumps (.pkl); default: [analysis.load] "
                                                     "prompts of the inventory"),
    dataset: Optional[str] = typer.Option(None, "--dataset",
                                          help="random (offline random token ids: they say nothing about "
                                               "acceptance; the default without a prompt file), or "
                                               "sharegpt-file=PATH (a ShareGPT JSON file on the host)"),
    seed: int = typer.Option(1, "--seed", help="bench_serving --seed (same prompts for every configuration)"),
    at: Optional[int] = typer.Option(None, "--at", help="the concurrency the choice is made at "
                                                        "(default: the highest --concurrency)"),
    itl_margin: float = typer.Option(25.0, "--itl-margin",
                                     help="choice rule: p99 ITL may exceed the baseline's by at most this %"),
    repeats: int = typer.Option(1, "--repeats", help="extra runs of the best two and the baseline, for the "
                                                     "run-to-run noise (0: none)"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="results folder (default tune-results/<host>/): "
                                                               "results.jsonl and tune.png"),
    resume: bool = typer.Option(False, "--resume", help="continue the sweep in --out, skipping finished "
                                                        "configurations"),
    apply: bool = typer.Option(False, "--apply", help="write the result into the inventory's [smoke.launch] "
                                                      "(comments kept; the diff is shown): see --apply-as"),
    apply_as: Optional[str] = typer.Option(None, "--apply-as", metavar="auto|schedule|budget",
                                           help="with --apply: schedule = the per-concurrency winners as "
                                                "budget_schedule (the payload's --speculative-ddtree-budget-"
                                                "schedule), budget = the choice at --at as budget/topk, auto "
                                                "(default) = the schedule when the winners differ across "
                                                "concurrencies and the host's family takes one, else the budget"),
    yes: bool = typer.Option(False, "--yes", help=f"allow a grid over {tune.MAX_GRID} launches"),
    trust_new_host: bool = typer.Option(False, "--trust-new-host", help="record an unknown host key in known_hosts"),
    json_output: bool = typer.Option(False, "--json", help="print one JSON document on stdout"),
) -> None:
    """Sweep DDTree budget x top-K against the DFlash chain and no speculation, with SGLang's
    bench_serving on the host; rank, plot, choose, optionally write the choice."""
    from ddtree_deploy.tuning import run as tune_run

    # The options first (bad input before anything is read), then the host and its prompts.
    name, path = _dataset(dataset or "random")
    opts = tune.TuneOptions(
        budgets=_ints(budgets, "--budgets", "budget", tune.MAX_BUDGET),
        topk=_ints(topk, "--topk", "top-K", 1 << 20),
        concurrency=_ints(concurrency, "--concurrency", "concurrency", 1 << 16),
        baselines=tune.parse_baselines(baseline), requests=requests, input_len=input_len,
        output_len=output_len, dataset=name, dataset_path=path, seed=seed, at=at,
        itl_margin_pct=itl_margin, repeats=repeats)
    tune.check_options(opts, yes=yes)
    if apply_as is not None and not apply:
        raise BadInput(f"--apply-as {apply_as}: only with --apply (it says what --apply writes)")
    mode = check_apply_as(apply_as or "auto")
    h = load_host(host)
    refuse_container(h, "tune")
    sample = _prompts(h, prompts_file, dataset)
    if sample is not None:  # the operator's prompts: the dataset (random ids only when asked for)
        opts = replace(opts, dataset="prompts", dataset_path=None, prompts=sample.source,
                       prompts_digest=sample.digest, categories=sample.shares(requests))
        tune.check_options(opts, yes=yes)
        err.print(f"[dim]{safe(h.name)}:[/] prompts {safe(sample.describe())}", highlight=False)
    outcome = tune_run.tune_host(
        h, lambda: transport_for(h, trust_new_host=trust_new_host), opts, out_dir=out_dir, resume=resume,
        yes=yes, apply=apply, apply_as=mode,
        progress=lambda step: err.print(f"[dim]{safe(h.name)}:[/] {safe(step)}", highlight=False),
        heartbeat=lambda key, s: err.print(f"[dim]{safe(h.name)}: {safe(key)}: still running ({s:.0f} s)[/]",
                                           highlight=False),
        sample=sample)
    if outcome.apply and outcome.apply.get("diff"):
        err.print(f"--apply: {safe(outcome.apply['file'])}:", highlight=False, soft_wrap=True)
        for line in outcome.apply["diff"].splitlines():  # a diff is read line by line: never wrapped
            err.print(plain(line), highlight=False, markup=False, soft_wrap=True)
    if json_output:
        emit_host(h.name, outcome.to_json(), ok=not outcome.stopped)
        if outcome.stopped:
            raise typer.Exit(1)
        return
    for line in tune.table_lines(opts, outcome.records):
        out.print(line, highlight=False, markup=False)
    for line in outcome.choice.lines(opts.itl_margin_pct):
        say(line)
    pruned = tune.pruned(opts, outcome.records)
    if pruned:
        say(f"pruned (not launched): {', '.join(pruned)}")
    say(f"results: {outcome.results_path}")
    say(f"plot: {outcome.plot_path}" if outcome.plot_path else outcome.plot_note or "no plot")
    if outcome.stopped:
        say(f"sweep stopped early: {outcome.stopped}")
    if outcome.apply is not None:
        for line in apply_lines(outcome.apply):
            say(line)
    if outcome.stopped:
        raise typer.Exit(1)


def apply_lines(a: dict) -> list[str]:
    """What ``--apply`` did, in the words of its result (tune_run.apply_choice)."""
    if not a["written"]:
        return [f"--apply: nothing written ({a.get('why')})"]
    if a.get("as") == "schedule":
        head = (f"--apply: wrote budget_schedule = \"{a['schedule']}\" into {a['file']} (budget and topk removed: "
                f"the server takes one or the other)")
    else:
        head = f"--apply: wrote budget {a['budget']} and topk {a['topk']} into {a['file']}"
    return [f"{head}; {a['why_as']}" if a.get("why_as") else head,
            *(f"--apply: note: {note}" for note in a.get("notes") or ())]


def _prompts(h, given: Optional[Path], dataset: Optional[str]):
    """The prompt sample: ``--prompts``, else the inventory's ``[analysis.load] prompts``
    (relative to the inventory's folder) unless ``--dataset`` asks for another; None: none."""
    from ddtree_deploy.settings.analysis import parse_analysis
    from ddtree_deploy.tuning.prompts import read_prompts

    if given is not None and dataset is not None:
        raise BadInput("--prompts and --dataset: give one (the prompt file is the dataset)")
    if given is None:
        settings = parse_analysis(h.analysis, source=h.source)
        if dataset is not None or settings is None or settings.load is None:
            return None
        from ddtree_deploy.serve.loadstep import prompts_path

        given = prompts_path(settings.load, h.source)  # as the speed gate's load step reads it
    return read_prompts(given)


def _dataset(value: str) -> tuple[str, Optional[str]]:
    """``random`` or ``sharegpt-file=PATH`` (an option takes one value, so the path rides on it)."""
    if value == "random":
        return "random", None
    if value.startswith("sharegpt-file=") and value.split("=", 1)[1]:
        return "sharegpt-file", value.split("=", 1)[1]
    if value in ("sharegpt-file", "sharegpt-file="):
        raise BadInput("--dataset sharegpt-file needs a PATH: --dataset sharegpt-file=/data/sharegpt.json")
    raise BadInput(f"--dataset: {value!r} is not 'random' or 'sharegpt-file=PATH'")


__all__ = ["apply_lines", "tune_cmd"]
