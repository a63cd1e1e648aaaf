"""`tune` on the operator's traffic, pure parts: the prompt sample (tuning/prompts.py: JSONL of
prompts or chats with categories, SGLang request dumps read without running anything in
them), the benchmark module by release (decided from each covered release's wheel), the
best configuration at every concurrency and the schedule it implies (tuning/tune.py), and
the host program's measure of a concurrency made of one run per category.
"""

from __future__ import annotations

import json
import pickle
import sys
import types
import zipfile
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.hostprog import tune as host_tune
from ddtree_deploy.release.metric_names import PINNED
from ddtree_deploy.tuning import prompts, tune, run as tune_run
from ddtree_deploy.tuning.tune import Config, Measure, Record, TuneOptions


# ----------------------------------------------------------------------------- the sample


def test_jsonl_prompts_chats_and_categories():
    text = "\n".join([
        json.dumps("plain prompt string here"),
        json.dumps({"prompt": "write a sort in C", "category": "code"}),
        json.dumps({"text": "summarise this please", "category": "chat"}),
        json.dumps({"messages": [{"role": "system", "content": "be brief"},
                                 {"role": "user", "content": "what is DDTree"},
                                 {"role": "assistant", "content": "a tree"},
                                 {"role": "user", "content": "and its budget?"}], "category": "chat"}),
        json.dumps({"conversations": [{"from": "human", "value": "hello there friend"}, {"from": "gpt", "value": "hi"}]}),
        json.dumps({"prompt": "short"}),  # one word: the benchmark would drop it
        "",
    ])
    s = prompts.parse_jsonl(text, source="p.jsonl")
    assert [(p.category, p.text) for p in s.prompts] == [
        ("all", "plain prompt string here"), ("code", "write a sort in C"), ("chat", "summarise this please"),
        ("chat", "be brief\n\nwhat is DDTree\n\na tree\n\nand its budget?"), ("all", "hello there friend")]
    assert s.skipped == 1 and s.categories == ("all", "chat", "code") and len(s.digest) == 64
    assert s.shares(10) == (("all", 2), ("chat", 2), ("code", 1))  # by share, never more than there are
    assert s.describe() == "p.jsonl: 5 prompts (all 2, chat 2, code 1); 1 skipped"
    lines = [json.loads(x) for x in prompts.custom_lines(["a b", "c d"]).splitlines()]
    assert lines[0] == {"conversations": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": ""}]}


@pytest.mark.parametrize("line, says", [
    ("{not json", "p.jsonl:1: not a JSON line; write each line as a JSON string"),
    ('{"prompt": "a b", "category": "a b c"}', "p.jsonl:1: category 'a b c' is not a short name"),
    ('{"messages": []}', "p.jsonl:1: messages must be a non-empty list of turns"),
    ('{"messages": [{"role": "assistant", "content": "a b"}]}', "p.jsonl:1: the chat has no user turn"),
    ('{"question": "a b"}', "p.jsonl:1: no prompt in this line"),
    ("[1, 2]", "p.jsonl:1: a JSON list is not a prompt"),
    ('"one"', "p.jsonl: no usable prompt in the file"),
])
def test_a_bad_line_is_one_line_naming_file_and_line(line, says):
    with pytest.raises(BadInput) as exc:
        prompts.parse_jsonl(line + "\n", source="p.jsonl")
    assert str(exc.value).startswith(says) and "\n" not in str(exc.value) and "; " in str(exc.value)


@pytest.fixture
def sglang_io_struct(monkeypatch):
    """A class at SGLang's own dotted name, so a dump pickled here names what SGLang's names
    (sglang.srt.managers.io_struct.GenerateReqInput), as the server writes it; gone after."""
    names = ["sglang", "sglang.srt", "sglang.srt.managers", "sglang.srt.managers.io_struct"]
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))

    class GenerateReqInput:
        def __init__(self, text=None, input_ids=None, sampling_params=None):
            self.text, self.input_ids, self.sampling_params = text, input_ids, sampling_params or {}

    GenerateReqInput.__module__ = "sglang.srt.managers.io_struct"
    GenerateReqInput.__qualname__ = "GenerateReqInput"
    sys.modules["sglang.srt.managers.io_struct"].GenerateReqInput = GenerateReqInput
    return GenerateReqInput


def test_a_request_dump_gives_its_text_prompts(sglang_io_struct, tmp_path):
    req = sglang_io_struct
    dump = {"server_args": req(text="not a request"),
            "requests": [(req(text="explain the tree budget"), {"meta_info": {"completion_tokens": 9}}, 1.0, 2.0),
                         (req(text=["batch one here", "batch two here"]), {}, 1.0, 2.0),
                         (req(input_ids=[1, 2, 3]), {}, 1.0, 2.0)]}
    path = tmp_path / "2026-12-01_10-00-00.pkl"
    path.write_bytes(pickle.dumps(dump))
    sys.modules.pop("sglang.srt.managers.io_struct")  # reading it needs no sglang (none on this machine)
    s = prompts.read_prompts(path)
    assert [p.text for p in s.prompts] == ["explain the tree budget", "batch one here", "batch two here"]
    assert s.kind == "dump" and s.skipped == 1 and s.categories == ("all",)


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("touch " + str(_Boom.marker),))


def test_a_hostile_dump_runs_nothing(tmp_path):
    _Boom.marker = tmp_path / "pwned"
    path = tmp_path / "evil.pkl"
    path.write_bytes(pickle.dumps({"requests": [(_Boom(), {}, 0, 0)]}))
    with pytest.raises(BadInput, match="none of the dump's 1 requests carries a text prompt"):
        prompts.read_prompts(path)
    assert not _Boom.marker.exists()
    (tmp_path / "junk.pkl").write_bytes(b"\x80\x04junk")
    with pytest.raises(BadInput, match=r"junk.pkl: not an SGLang request dump"):
        prompts.read_prompts(tmp_path / "junk.pkl")
    with pytest.raises(BadInput, match=r"nothing.jsonl: cannot read the prompt file"):
        prompts.read_prompts(tmp_path / "nothing.jsonl")


# ----------------------------------------------------------------------------- the benchmark by release


@pytest.mark.parametrize("version", sorted(PINNED))
def test_the_benchmark_module_from_each_release_wheel(version):
    """sglang.benchmark.serving from 0.5.15 (0.5.23's sglang.bench_serving is its deprecated
    shim), sglang.bench_serving before: decided from the release's own file list."""
    from packaging.version import Version

    from ddtree_deploy.sandbox import release_wheel

    with zipfile.ZipFile(release_wheel(version)) as zf:
        names = zf.namelist()
    want = "sglang.benchmark.serving" if Version(version) >= Version("0.5.15") else "sglang.bench_serving"
    assert tune_run.bench_module(names) == want
    if want == "sglang.benchmark.serving":
        with zipfile.ZipFile(release_wheel(version)) as zf:
            shim = zf.read("sglang/bench_serving.py").decode()
        assert "from sglang.benchmark.serving import" in shim  # the old name only forwards


def test_no_benchmark_at_all_is_said():
    with pytest.raises(DeployError, match="ships no serving benchmark"):
        tune_run.bench_module(["sglang/__init__.py"])


def test_bench_argv_with_a_prompt_file_and_the_runs_by_category():
    from ddtree_deploy.settings.smoke import LaunchSettings

    launch = LaunchSettings(model="/m", port=30001)
    opts = TuneOptions(dataset="prompts", prompts="p.jsonl", categories=(("chat", 4), ("code", 3)), output_len=64)
    argv = tune_run.bench_argv(launch, opts, "sglang.benchmark.serving")
    assert argv[:3] == ["{python}", "-m", "sglang.benchmark.serving"]
    assert argv[-4:] == ["--dataset-name", "custom", "--sharegpt-output-len", "64"]
    assert "--tokenize-prompt" not in argv and "--num-prompts" not in argv  # custom refuses it; per run below
    assert tune_run.category_runs(opts, "/s/tune/r/prompts") == [
        {"category": "chat", "requests": 4, "args": ["--dataset-path", "/s/tune/r/prompts/0.jsonl", "--num-prompts", "4"]},
        {"category": "code", "requests": 3, "args": ["--dataset-path", "/s/tune/r/prompts/1.jsonl", "--num-prompts", "3"]}]
    random = tune_run.bench_argv(launch, TuneOptions())
    assert random[2] == "sglang.bench_serving" and "random-ids" in random
    assert TuneOptions().dataset_label.startswith("prompts: RANDOM TOKEN IDS (they say nothing about acceptance")
    assert opts.dataset_label == "prompts: p.jsonl (chat 4, code 3 per run)"


# ----------------------------------------------------------------------------- the best at every load


def rec(key, tps_itl: dict) -> Record:
    return Record(config=Config.from_key(key), stage="coarse", status="ok",
                  measures=tuple(Measure(c, tps, 1.0, 10, 20, 5, itl, completed=10) for c, (tps, itl) in tps_itl.items()))


def test_the_best_at_every_concurrency_and_its_schedule():
    opts = TuneOptions(budgets=(16, 64, 128), topk=(4, 8), concurrency=(1, 8, 32, 64), baselines=("dflash", "none"))
    records = [
        rec("dflash", {1: (100, 10), 8: (500, 20), 32: (900, 40), 64: (1000, 80)}),
        rec("none", {1: (60, 8), 8: (400, 12), 32: (850, 30), 64: (1100, 50)}),
        rec("ddtree-b128-k8", {1: (140, 11), 8: (550, 24), 32: (800, 60), 64: (700, 150)}),
        rec("ddtree-b64-k4", {1: (120, 10), 8: (620, 22), 32: (880, 45), 64: (900, 110)}),
        # the fastest at 32, but its p99 ITL is past 25% over the chain's: not eligible there
        rec("ddtree-b16-k4", {1: (90, 9), 8: (560, 20), 32: (1200, 51), 64: (950, 90)}),
    ]
    best = tune.best_per_concurrency(opts, records)
    assert [(b["concurrency"], b["config"]) for b in best] == [(1, "ddtree-b128-k8"), (8, "ddtree-b64-k4"),
                                                               (32, "dflash"), (64, "none")]
    assert best[0]["ratio"] == {"dflash": 1.4, "none": pytest.approx(140 / 60)}
    # The payload's schedule has no entry without speculation: at 64 it serves the fastest thing it
    # can (the chain, 1,000 tok/s; B=16 is 950 and the wider trees are past the ITL limit), said
    # with its cost, and that entry merges with 32's.
    plan = tune.plan(opts, records)
    assert plan.text == "1:128/8,8:64/4,32:chain" and plan.differ
    assert [(r["concurrency"], r["best"], r["served"]) for r in plan.rows] == [
        (1, "ddtree-b128-k8", "ddtree-b128-k8"), (8, "ddtree-b64-k4", "ddtree-b64-k4"), (32, "dflash", "dflash"),
        (64, "none", "dflash")]
    assert plan.notes == ("concurrency 64: no speculation was fastest (1,100.0 tok/s), which the payload's schedule "
                          "cannot express (it has no entry without speculation): the schedule serves DFlash chain "
                          "there (1,000.0 tok/s, -9.1% against no speculation)",)
    lines = tune.table_lines(opts, records)
    assert "best per concurrency (schedule 1:128/8,8:64/4,32:chain):" in lines
    assert f"  note: {plan.notes[0]}" in lines
    summary = tune.summary(opts, records)
    assert summary["schedule"] == "1:128/8,8:64/4,32:chain" and summary["schedule_plan"] == plan.to_json()
    assert summary["best_per_concurrency"] == best  # the per-concurrency table, kept whole (64: none)
    assert tune.summary_line(opts, records)["kind"] == "summary"
    assert tune.summary_line(opts, records)["schedule_plan"]["notes"] == list(plan.notes)


def test_the_table_has_a_column_pair_per_category():
    opts = TuneOptions(budgets=(16,), topk=(2,), concurrency=(4,), baselines=("dflash",), dataset="prompts",
                       prompts="p.jsonl", categories=(("chat", 4), ("code", 4)))
    cats = {"chat": {"output_tps": 80.0}, "code": {"output_tps": 120.0}}
    r = Record(config=Config("ddtree", 16, 2), stage="coarse", status="ok",
               measures=(Measure(4, 100.0, 1.0, 10, 20, 5, 9, completed=8, categories=cats),),
               category_accept={"chat": 2.9, "code": 4.6})
    text = "\n".join(tune.table_lines(opts, [rec("dflash", {4: (80.0, 9)}), r]))
    assert "chat tok/s   acc |         code tok/s   acc" in text
    assert "80.0  2.90 |              120.0  4.60" in text
    back = Record.from_json(json.loads(json.dumps(r.to_json())))
    assert back.category_accept == r.category_accept and back.measures[0].categories == cats


def test_the_host_measures_a_concurrency_as_its_runs_together():
    parts = {"chat": {"output_tps": 50.0, "request_tps": 1, "completed": 4, "duration_s": 2.0, "output_tokens": 100,
                      "ttft_p50_ms": 10, "ttft_p99_ms": 30, "itl_p50_ms": 5, "itl_p99_ms": 20, "accept_length": 2.0},
             "code": {"output_tps": 100.0, "request_tps": 1, "completed": 12, "duration_s": 3.0, "output_tokens": 300,
                      "ttft_p50_ms": 20, "ttft_p99_ms": 25, "itl_p50_ms": 7, "itl_p99_ms": 40, "accept_length": 2.5}}
    m = host_tune.combine(4, parts)
    assert m["output_tps"] == 80.0 and m["request_tps"] == 16 / 5.0 and m["completed"] == 16
    assert m["ttft_p50_ms"] == (10 * 4 + 20 * 12) / 16 and m["ttft_p99_ms"] == 30 and m["itl_p99_ms"] == 40
    assert m["categories"] is parts and m["accept_length"] == 2.5


def test_options_refuse_a_prompt_dataset_without_prompts():
    with pytest.raises(BadInput, match="--prompts: the prompt file gave no prompts"):
        tune.check_options(TuneOptions(dataset="prompts"), yes=False)


def test_results_of_a_prompt_sweep_resume_only_with_the_same_sample(tmp_path):
    opts = TuneOptions(dataset="prompts", prompts="p.jsonl", prompts_digest="a" * 64, categories=(("all", 4),))
    head = tune.header("gpu1", opts, {"series": "s"})
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(head) + "\n" + json.dumps({"kind": "summary", "schedule": "4:16/2"}) + "\n")
    assert tune.load_results(path, head) == []  # the closing summary line is no run
    other = tune.header("gpu1", TuneOptions(dataset="prompts", prompts="p.jsonl", prompts_digest="b" * 64,
                                            categories=(("all", 4),)), {"series": "s"})
    with pytest.raises(BadInput, match="made with different bench"):
        tune.load_results(path, other)
    # A results file from before prompts (no such keys) still resumes a random-ids sweep.
    assert "prompts_digest" not in TuneOptions().bench_settings()
    assert Path(path).exists()
