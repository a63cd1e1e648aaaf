"""The speed gate's load step (``[analysis.load]``): whether a push drives its server with
SGLang's own benchmark, and with what (issue 29 §2: "an optional load step drives the server
when there is no live traffic").

Pure, but for ``sample_of`` (it reads the operator's prompt file on this machine):

- ``decide(load, probe)``: drive or not, and why, from the table and one short window of the
  old server (``probe``): ``when = "idle"`` drives only a server with no traffic of its own
  (live traffic is the better measure: the load step is not run, and that is said);
  ``when = "always"`` drives it whatever its traffic.
- ``plan(load, sample, url=..., module=...)``: what the host runs, built with tune's own parts
  (tuning/run.py: ``server_bench_argv`` and ``prompts_dataset_args``, the module
  ``bench_module`` picked from what the release ships; tuning/prompts.py: the sample read
  and written as SGLang's ``custom`` dataset). One file of every prompt (the categories do
  not matter to a load), cycled to ``requests`` lines so that one benchmark run lasts the
  windows (the host program starts it again when it finishes early).
- ``Plan.request(...)``: the ``load`` part of the serve program's ``metrics`` request
  (hostprog/load.py runs it); ``Plan.record()``: what the baseline, the bake's JSON and the
  history keep of it (the prompt file, its digest, the concurrency, the output length, the
  module), so that a rerun after Ctrl-C bakes under the same load (``from_record``) and
  ``history`` says under which load the figures were taken (``said``).

Both sides of an analysis see the same load: the bake is driven exactly when its baseline
was (serve_gate.gate_push reads the baseline's record).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from ddtree_deploy.base.codes import Code
from ddtree_deploy.base.errors import DeployError
from ddtree_deploy.serve.figures import ServedFigures, Unavailable
from ddtree_deploy.settings.analysis import AnalysisSettings, LoadStep
from ddtree_deploy.tuning import prompts, run as tune_run

REQUESTS_PER_SLOT = 32  # requests per concurrency slot in one benchmark run (its prompts cycled)
MAX_REQUESTS = 20_000  # at most, in one run: the benchmark tokenizes every prompt before it sends
READY_TIMEOUT_S = 300.0  # from the benchmark's start to its first measured request, at most
TERM_GRACE_S = 5.0  # TERM, then KILL
HEARTBEAT_S = 1.0  # the serve program beats this often under load: a gone controller is seen at once


class LoadFailed(DeployError):
    """The load step could not drive the server (the benchmark failed, or its table changed)."""


@dataclass(frozen=True)
class Decision:
    drive: bool
    why: str  # one line, said in the progress and kept with the baseline


def decide(load: LoadStep | None, probe: ServedFigures | Unavailable | None) -> Decision:
    """Drive the server or not (see the module doc). ``probe``: one window of the old server."""
    if load is None:
        return Decision(False, "no [analysis.load] table: the server's own traffic is measured")
    if load.when == "always":
        return Decision(True, 'the load step drives the server ([analysis.load] when = "always")')
    if isinstance(probe, ServedFigures) and not probe.idle:
        rate = f", {probe.request_rate:.1f} req/s" if probe.request_rate is not None else ""
        running = f"{probe.running:g} running" if probe.running is not None else "requests finishing"
        return Decision(False, f"the old server has live traffic ({running}{rate}): the load step is not run "
                               '(when = "idle"): its own traffic is measured')
    if isinstance(probe, Unavailable) or probe is None:
        why = probe.why if isinstance(probe, Unavailable) else "no window"
        return Decision(False, f"the old server's figures could not be read ({why}): the load step is not run")
    return Decision(True, "the old server has no live traffic: the load step drives it")


def describe(record: dict | None) -> str:
    """A load record (``Plan.record``) in words: which prompts, at which concurrency."""
    if not isinstance(record, dict):
        return ""
    return (f"{record.get('prompt_count', '?')} prompts of {record.get('prompts', '?')} at concurrency "
            f"{record.get('concurrency', '?')}, {record.get('output_len', '?')} output tokens each "
            f"(python -m {record.get('module', '?')})")


def said(record: dict | None) -> str:
    """`` under the load step (...)``, or "" without one: appended to a figures line."""
    return f" under the load step ({describe(record)})" if isinstance(record, dict) else ""


@dataclass(frozen=True)
class Plan:
    """What the host runs for the load step (hostprog/load.py)."""

    module: str
    argv: tuple[str, ...]  # the benchmark, without --dataset-path, --num-prompts, --max-concurrency, --output-file
    text: str = field(repr=False)  # every prompt, as SGLang's custom dataset lines
    prompts: str  # the prompt file (this machine)
    digest: str
    count: int  # prompts in it
    requests: int  # lines of one run's file (the prompts cycled)
    concurrency: int
    output_len: int
    why: str = ""

    def record(self) -> dict:
        return {"prompts": self.prompts, "digest": self.digest, "prompt_count": self.count,
                "concurrency": self.concurrency, "output_len": self.output_len, "module": self.module,
                "requests": self.requests, "argv": list(self.argv), "why": self.why}

    def request(self, tag: str) -> dict:
        """The ``load`` part of the serve program's ``metrics`` request (``tag``: names the
        benchmark's private scratch folder on the host, hostprog/load.py)."""
        return {"argv": list(self.argv), "prompts": self.text, "requests": self.requests,
                "concurrency": self.concurrency, "tag": tag,
                "ready_timeout_s": READY_TIMEOUT_S, "term_grace_s": TERM_GRACE_S}


def requests_for(count: int, concurrency: int) -> int:
    """Lines of one benchmark run: every prompt once, and at least ``REQUESTS_PER_SLOT`` per
    slot (so one run outlasts a usual window), at most ``MAX_REQUESTS``."""
    return max(count, min(MAX_REQUESTS, concurrency * REQUESTS_PER_SLOT))


def plan(load: LoadStep, sample: prompts.PromptSample, *, url: str, module: str, why: str = "") -> Plan:
    """The load step's benchmark against the server at ``url`` (``[serve] url``), with tune's parts."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    argv = tune_run.server_bench_argv(parts.hostname or "127.0.0.1", port, module, tokenizer=load.tokenizer) \
        + tune_run.prompts_dataset_args(load.output_len)
    texts = [p.text for p in sample.prompts]
    return Plan(module=module, argv=tuple(argv), text=prompts.custom_lines(texts), prompts=sample.source,
                digest=sample.digest, count=len(texts), requests=requests_for(len(texts), load.concurrency),
                concurrency=load.concurrency, output_len=load.output_len, why=why)


def from_record(record: dict, load: LoadStep | None, sample: prompts.PromptSample | None, *, url: str) -> Plan:
    """The same load as a recorded baseline's (a rerun after Ctrl-C bakes under it); LoadFailed
    when the table or the prompt file changed since (the two sides would not be comparable)."""
    if load is None or sample is None:
        raise LoadFailed("the baseline was taken under the load step, and the host's [analysis.load] is gone: "
                         "the bake cannot be driven the same way", code=Code.FAILED)
    changed = [name for name, now, then in (("the prompt file", sample.digest, record.get("digest")),
                                            ("concurrency", load.concurrency, record.get("concurrency")),
                                            ("output_len", load.output_len, record.get("output_len")))
               if now != then]
    if changed:
        raise LoadFailed(f"[analysis.load] changed since the baseline was taken ({', '.join(changed)}): the bake "
                         "would not be driven as the baseline was", code=Code.FAILED,
                         hint="put the table back as it was, or push again from a deployed host")
    return plan(load, sample, url=url, module=str(record.get("module") or tune_run.BENCH_MODULE),
                why=str(record.get("why") or ""))


def prompts_path(load: LoadStep, source: str | None) -> Path:
    """The prompt file: as written, a relative path from the inventory file's folder (as tune reads it)."""
    given = Path(load.prompts).expanduser()
    if not given.is_absolute() and source:
        return Path(source).parent / given
    return given


def sample_of(host, analysis: AnalysisSettings | None) -> prompts.PromptSample | None:
    """The load step's prompt sample, read (one BadInput line when it cannot be); None: no load step."""
    if analysis is None or analysis.load is None:
        return None
    return prompts.read_prompts(prompts_path(analysis.load, host.source))


__all__ = ["Decision", "LoadFailed", "Plan", "decide", "describe", "from_record", "plan", "prompts_path",
           "requests_for", "said", "sample_of"]
