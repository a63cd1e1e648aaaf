"""The pure side of the smoke: inventory settings, the request built for the host, and
the report read back. Exact-equality tests, no host."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput, DeployError
from ddtree_deploy.base.toml_input import TomlFile
from ddtree_deploy.settings import smoke as smoke_settings
from ddtree_deploy.settings.inventory import parse_host
from ddtree_deploy.smoke import plan as smoke_plan, report as smoke_report

REPO = Path(__file__).resolve().parent.parent.parent
SRC = "hosts/gpu1.toml"


def settings(text: str) -> smoke_settings.SmokeSettings:
    host = parse_host('[host]\npython = "/opt/py/bin/python"\n[ssh]\nhost = "gpu1"\n' + text,
                      name="gpu1", source=SRC)
    return smoke_settings.parse_settings(host.smoke, source=host.source)


GPU_HOST = """
[smoke]
levels = ["launch", "compile", "import", "cli"]
import_exclude = ["sglang.srt.speculative.dflash_worker"]
[smoke.launch]
model = "/models/Qwen3-8B"
draft_model = "/models/Qwen3-8B-DFlash-b16"
budget = 64
topk = 8
port = 30200
extra_args = ["--mem-fraction-static", "0.8", "--tp-size", "1"]
min_free_gib = 40
"""


def test_defaults_without_smoke_table():
    s = settings("")
    assert s == smoke_settings.SmokeSettings(levels=("compile", "import", "cli"), launch=None)


def test_gpu_host_settings_and_level_order():
    s = settings(GPU_HOST)
    assert s.levels == ("compile", "import", "cli", "launch")
    assert s.launch.min_free_gib == 40.0 and s.launch.gpu is True
    assert smoke_plan.launch_argv(s.launch) == [
        "{python}", "-m", "sglang.launch_server", "--model-path", "/models/Qwen3-8B",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", "/models/Qwen3-8B-DFlash-b16",
        "--speculative-ddtree-budget", "64", "--speculative-ddtree-topk", "8",
        "--host", "127.0.0.1", "--port", "30200",
        "--mem-fraction-static", "0.8", "--tp-size", "1",
    ]


# The host file's first 4 lines are the [host] and [ssh] tables: [smoke]'s keys are on line 6.
@pytest.mark.parametrize("text, message", [
    ('[smoke]\nlevels = ["compile", "fly"]\n',
     f"{SRC}: line 6: smoke.levels: unknown level 'fly'; use levels from compile, import, cli, launch"),
    ('[smoke]\nlevels = ["launch"]\n',
     f"{SRC}: line 6: smoke.levels: 'launch' needs a [smoke.launch] table; "
     "add [smoke.launch] with model, draft_model, port..."),
    ('[smoke]\ntimout_s = 3\n',
     f"{SRC}: line 6: smoke.timout_s: unknown key (known keys here: import_exclude, launch, levels, timeout_s); "
     "did you mean timeout_s? fix its spelling or remove it"),
    ('[smoke.launch]\nport = 70000\n',
     f"{SRC}: line 6: smoke.launch.port: must be an integer from 1 to 65535, not 70000; "
     "write a number without quotes, e.g. port = 1"),
    ('[smoke.launch]\nextra_args = "--tp 2"\n',
     f"{SRC}: line 6: smoke.launch.extra_args: must be a list of strings, not '--tp 2'; "
     'write a list in brackets, e.g. extra_args = ["--tp-size", "1"]'),
    ('[smoke.launch]\ngpu = "no"\n',
     f"{SRC}: line 6: smoke.launch.gpu: must be true or false, not 'no'; write true or false without quotes"),
    ('[smoke.launch]\ncommand = ["python", "{modle}"]\n',
     f"{SRC}: line 6: smoke.launch.command: unknown placeholder {{modle}}; use {{python}}, {{model}}, "
     "{draft_model}, {budget}, {topk}, {host}, {port}, {extra_args}"),
    ('[smoke]\nlaunch = 3\n',
     f"{SRC}: line 6: smoke.launch: must be a table, not 3; write it as a [smoke.launch] table"),
])
def test_bad_settings_name_file_and_key(text, message):
    with pytest.raises(BadInput) as exc:
        settings(text)
    assert exc.value.message == message


def test_command_template_fills_argv_without_a_shell():
    s = settings('[smoke.launch]\nmodel = "/m/a b; rm -rf ~"\nport = 1234\ngpu = false\n'
                 'extra_args = ["--x", "$(y)"]\n'
                 'command = ["{python}", "standin.py", "--model-path", "{model}", "--port={port}", "{extra_args}"]\n')
    # Hostile-looking values stay single argv elements: nothing here is ever parsed by a shell.
    assert smoke_plan.launch_argv(s.launch) == ["{python}", "standin.py", "--model-path", "/m/a b; rm -rf ~",
                                           "--port=1234", "--x", "$(y)"]


def test_template_using_an_unset_value_is_bad_input():
    s = settings('[smoke.launch]\nmodel = "/m"\ncommand = ["{python}", "x", "--topk", "{topk}"]\n')
    with pytest.raises(BadInput) as exc:
        smoke_plan.launch_argv(s.launch, source=SRC)
    # topk is not written: its line is [smoke.launch]'s header.
    assert exc.value.message == (f"{SRC}: line 5: smoke.launch.topk: not set, but the launch command uses {{topk}}; "
                                 "set topk in [smoke.launch], or drop {topk} from its command")


def test_series_flags_read_from_added_lines_only():
    text = ('+        parser.add_argument(\n+            "--speculative-ddtree-budget",\n'
            ' "--speculative-ddtree-context-only",\n-  "--speculative-ddtree-removed",\n'
            '+  x = "--speculative-ddtree-topk"  # twice\n+  "--speculative-ddtree-topk"\n')
    assert smoke_plan.series_flags([text]) == ("--speculative-ddtree-budget", "--speculative-ddtree-topk")


def test_the_real_series_adds_the_flags_the_default_launch_command_uses():
    texts = [p.read_text() for p in sorted((REPO / "patches/sglang-0.5.12").glob("*.patch"))]
    flags = smoke_plan.series_flags(texts)
    assert {"--speculative-ddtree-budget", "--speculative-ddtree-topk"} <= set(flags)


TOUCHED = ("sglang/srt/speculative/spec_info.py", "sglang/srt/server_args.py",
           "sglang/srt/speculative/dflash_worker.py", "sglang/srt/speculative/ddtree_utils.py")


def test_plan_request_is_exact():
    s = settings(GPU_HOST)
    plan = smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=("--speculative-ddtree-budget",),
                            log_path="/h/.ddtree-deploy/smoke/r1/server.log", source=SRC,
                            family=smoke_settings.FAMILY_SMOKE_DEFAULT)
    assert plan.levels == ("compile", "import", "cli", "launch")
    assert plan.excluded_modules == ("sglang.srt.speculative.dflash_worker",)
    req = plan.request
    assert req["compile"] == {"package": "sglang", "files": list(TOUCHED)}
    assert req["import"] == {
        "modules": ["sglang.srt.speculative.spec_info", "sglang.srt.server_args",
                    "sglang.srt.speculative.ddtree_utils"],
        "attributes": [["sglang.srt.speculative.spec_info", "SpeculativeAlgorithm.DDTREE"]],
        "timeout_s": 300.0,
        "tree": smoke_plan.tree_probe(smoke_settings.FAMILY_SMOKE_DEFAULT, ("sglang.srt.speculative.dflash_worker",)),
    }
    assert req["cli"]["argv"] == ["{python}", "-m", "sglang.launch_server", "--help"]
    assert req["cli"]["validate"]["function"] == "prepare_server_args"
    assert req["cli"]["validate"]["argv"] == smoke_plan.launch_argv(s.launch)[3:]
    assert req["cli"]["validate"]["needs_paths"] == ["/models/Qwen3-8B", "/models/Qwen3-8B-DFlash-b16"]
    assert req["launch"]["min_free_mib"] == 40 * 1024
    assert req["launch"]["gpu_check"] is True
    assert req["launch"]["log_path"] == "/h/.ddtree-deploy/smoke/r1/server.log"
    assert req["launch"]["tree"] == {"budget": 64, "budget_field": "speculative_ddtree_budget", "worker_class": None,
                                     "prompts": list(smoke_plan.TREE_PROMPTS), "max_new_tokens": 256}
    assert req["cli"]["validate"]["width"] == {"field": "speculative_num_draft_tokens", "budget": 64,
                                               "budget_field": "speculative_ddtree_budget",
                                               "budget_flag": "--speculative-ddtree-budget"}


# ------------------------------------------------------ the family's [smoke] table

V2_LIKE = smoke_settings.FamilySmoke(budget_flag="--speculative-tree-budget", topk_flag="--speculative-tree-topk",
                            budget_field="tree_budget", worker_class="DDTreeWorkerV2",
                            worker_module="sglang.srt.speculative.ddtree_worker_v2",
                            probe_args=("--device", "cuda"))


def test_tree_probe_request_uses_the_family():
    probe = smoke_plan.tree_probe(V2_LIKE)
    assert probe["argv"] == ["--model-path", "{model}", "--speculative-algorithm", "DDTREE",
                             "--speculative-draft-model-path", "{draft_model}", "--speculative-tree-budget", "24",
                             "--skip-tokenizer-init", "--device", "cuda"]
    assert probe["budget"] == 24 and probe["width_field"] == "speculative_num_draft_tokens"
    assert probe["marker"] == "DDTREE_TREE_VERIFY" and probe["worker_class"] == "DDTreeWorkerV2"
    assert probe["skip_worker"] is None
    # Launch_server's order: plugins (a v2 family may register DDTREE there), parse, resolve, view.
    assert (probe["plugins"], probe["parse"], probe["resolve"]) == (
        ["sglang.srt.plugins", "load_plugins"], ["sglang.srt.server_args", "prepare_server_args"], "resolve_once")
    # The probe's budget is neither SGLang's default nor the draft block, so neither can pass for it.
    assert smoke_plan.PROBE_BUDGET + 1 not in (64 + 1, smoke_plan.TINY_DRAFT_CONFIG["block_size"])
    # A host that cannot import the worker module (import_exclude) is told to skip only that.
    assert smoke_plan.tree_probe(V2_LIKE, ("sglang.srt.speculative.ddtree_worker_v2",))["skip_worker"] == \
        "sglang.srt.speculative.ddtree_worker_v2"


def test_a_family_serving_hybrid_targets_probes_a_tiny_hybrid_config():
    hybrid = smoke_settings.FamilySmoke(**{**V2_LIKE.__dict__,
                                           "hybrid_report": ("sglang.srt.speculative.ddtree_hybrid", "describe")})
    probe = smoke_plan.tree_probe(hybrid)
    assert probe["configs"]["hybrid_model"] == smoke_plan.TINY_HYBRID_CONFIG
    assert probe["configs"]["hybrid_model"]["model_type"] == "qwen3_next"
    # The same resolution, on the hybrid folder, the radix cache off (its Mamba extra buffer
    # needs a GPU platform), then the family's report.
    assert probe["hybrid"] == {
        "argv": [("{hybrid_model}" if a == "{model}" else a) for a in probe["argv"]] + ["--disable-radix-cache"],
        "report": ["sglang.srt.speculative.ddtree_hybrid", "describe"]}
    assert "hybrid" not in smoke_plan.tree_probe(V2_LIKE)


def test_family_flags_reach_the_launch_command_and_its_validation():
    s = settings(GPU_HOST)
    plan = smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=(), log_path="l", levels=["cli", "launch"],
                            family=V2_LIKE)
    argv = plan.request["launch"]["argv"]
    assert argv[argv.index("--speculative-tree-budget") + 1] == "64"
    assert argv[argv.index("--speculative-tree-topk") + 1] == "8"
    assert "--speculative-ddtree-budget" not in argv
    assert plan.request["cli"]["validate"]["argv"] == argv[3:]
    assert "tree_budget" in plan.request["cli"]["validate"]["report"]
    assert plan.request["launch"]["tree"]["worker_class"] == "DDTreeWorkerV2"


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "patches").iterdir()
                                        if (p / "family.toml").is_file()))
def test_every_family_says_how_its_tree_shows(name):
    from ddtree_deploy.engine.series import read_family_info

    fam = read_family_info(REPO / "patches" / name).smoke
    # A family without a worker class would be checked by the marker alone, and one without a
    # worker module could not honour import_exclude: every family names both.
    assert fam.worker_class and fam.worker_module and fam.worker_module.endswith(
        "." + {"DFlashWorker": "dflash_worker", "DDTreeWorkerV2": "ddtree_worker_v2"}[fam.worker_class])
    plan = smoke_plan.plan_smoke(settings(""), touched_paths=TOUCHED, flags=(), log_path="l", levels=["cli"], family=fam)
    assert {fam.budget_flag, fam.topk_flag} <= set(plan.request["cli"]["expect"])


def test_real_family_smoke_table():
    from ddtree_deploy.engine.series import load_family

    fam = smoke_settings.family_smoke(load_family(REPO / "patches/sglang-0.5.12"))
    assert fam.budget_flag == "--speculative-ddtree-budget" and fam.budget_field == "speculative_ddtree_budget"
    assert fam.worker_class == "DFlashWorker" and fam.worker_module == "sglang.srt.speculative.dflash_worker"
    # The flags it names are flags the series adds.
    texts = [p.read_text() for p in sorted((REPO / "patches/sglang-0.5.12").glob("*.patch"))]
    assert {fam.budget_flag, fam.topk_flag} <= set(smoke_plan.series_flags(texts))


FAM = "patches/x/family.toml"


# family.toml's line 1 is its sglang range; [smoke]'s keys are on line 3.
@pytest.mark.parametrize("text, message", [
    ("smoke = 3\n", f"{FAM}: line 2: smoke: must be a table, not 3; write it as a [smoke] table"),
    ('[smoke]\nbudget_flg = "--x"\n',
     f"{FAM}: line 3: smoke.budget_flg: unknown key (known keys here: budget_field, budget_flag, hybrid_report, "
     "probe_args, schedule_flag, topk_flag, worker_class, worker_module); did you mean budget_flag? fix its spelling or remove it"),
    ('[smoke]\nbudget_flag = "budget"\n',
     f"{FAM}: line 3: smoke.budget_flag: must be a long option such as '--speculative-ddtree-budget', "
     "not 'budget'; write the flag the family's server takes, e.g. budget_flag = \"--speculative-ddtree-budget\""),
    ('[smoke]\nworker_class = "a.B"\n',
     f"{FAM}: line 3: smoke.worker_class: must be a Python identifier, not 'a.B'; "
     'write it in quotes, e.g. worker_class = "DFlashWorker"'),
    ('[smoke]\nworker_module = "a..b"\n',
     f"{FAM}: line 3: smoke.worker_module: must be a Python module path, not 'a..b'; "
     'write it in quotes, e.g. worker_module = "sglang.srt.speculative.dflash_worker"'),
    ('[smoke]\nhybrid_report = ["sglang.srt.speculative.ddtree_hybrid"]\n',
     f"{FAM}: line 3: smoke.hybrid_report: must be [module, function], not "
     "['sglang.srt.speculative.ddtree_hybrid']; "
     'write hybrid_report = ["sglang.srt.speculative.ddtree_hybrid", "describe"]'),
    ('[smoke]\nprobe_args = "--device cpu"\n',
     f"{FAM}: line 3: smoke.probe_args: must be a list of non-empty strings, not '--device cpu'; "
     'write a list in brackets, e.g. probe_args = ["--device", "cpu"]'),
])
def test_bad_family_smoke_table_is_one_line(text, message):
    doc = TomlFile('sglang = ">=0.5.12,<0.5.13"\n' + text, source=FAM)
    with pytest.raises(BadInput) as exc:
        smoke_settings.parse_family_smoke(doc)
    assert exc.value.message == message


def test_bad_family_smoke_table_stops_loading_the_family(tmp_path):
    from ddtree_deploy.engine.series import load_family

    (tmp_path / "fam").mkdir()
    (tmp_path / "fam/family.toml").write_text('sglang = ">=0.5.12,<0.5.13"\n[smoke]\nworker_class = 3\n')
    (tmp_path / "fam/series").write_text("")
    with pytest.raises(BadInput, match=r"family.toml: line 3: smoke.worker_class: must be a Python identifier, not 3; "
                                         "write it in quotes"):
        load_family(tmp_path / "fam")


def test_tree_probe_only_with_a_family():
    # push and smoke always pass the series' family; matrix --import has its own tree level.
    plan = smoke_plan.plan_smoke(settings(GPU_HOST), touched_paths=TOUCHED, flags=(), log_path="l", levels=["import"])
    assert "tree" not in plan.request["import"]


def test_plan_level_choice():
    s = settings(GPU_HOST)
    plan = smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=(), log_path="l", levels=["cli", "compile"])
    assert plan.levels == ("compile", "cli") and set(plan.request) == {"levels", "compile", "cli"}
    with pytest.raises(BadInput, match="unknown smoke level 'smoke'"):
        smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=(), log_path="l", levels=["smoke"])
    with pytest.raises(BadInput, match=r"the launch level needs a \[smoke.launch\] table"):
        smoke_plan.plan_smoke(settings(""), touched_paths=TOUCHED, flags=(), log_path="l", levels=["launch"],
                         source=SRC)


def test_validation_uses_sglang_flags_even_with_a_stand_in_command():
    s = settings('[smoke.launch]\nmodel = "/m"\ndraft_model = "/d"\nextra_args = ["--device", "cpu"]\n'
                 'command = ["{python}", "standin.py", "--model-path", "{model}"]\n')
    plan = smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=(), log_path="l", levels=["cli", "launch"])
    assert plan.request["cli"]["validate"]["argv"] == [
        "--model-path", "/m", "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/d",
        "--host", "127.0.0.1", "--port", "30188", "--device", "cpu"]
    assert plan.request["launch"]["argv"] == ["{python}", "standin.py", "--model-path", "/m"]


def test_no_validation_without_model_and_draft():
    plan = smoke_plan.plan_smoke(settings(""), touched_paths=TOUCHED, flags=(), log_path="l")
    assert plan.request["cli"]["validate"] is None


def test_read_answer():
    s = settings(GPU_HOST)
    plan = smoke_plan.plan_smoke(s, touched_paths=TOUCHED, flags=(), log_path="l", levels=["compile", "import"])
    answer = {"ok": True, "python": "/opt/py/bin/python", "levels": [
        {"level": "compile", "status": "passed", "seconds": 0.2, "detail": "4 files byte-compiled", "evidence": {}},
        {"level": "import", "status": "passed", "seconds": 7.5, "detail": "3 modules imported", "evidence": {}},
    ]}
    report = smoke_report.run_smoke("gpu1", plan, lambda request: answer)
    assert report.ok and report.failed is None
    assert report.levels[1].detail == ("3 modules imported; not imported here (smoke.import_exclude): "
                                       "sglang.srt.speculative.dflash_worker")
    assert report.lines()[0] == "compile  passed       0.2 s  4 files byte-compiled"
    failed = dict(answer, levels=[dict(answer["levels"][0], status="failed", detail="x.py:3: bad"),
                                  dict(answer["levels"][1], status="skipped")])
    report = smoke_report.read_answer("gpu1", plan, failed)
    assert not report.ok and report.failed.detail == "x.py:3: bad"
    assert report.to_json()["levels"][1]["status"] == "skipped"


@pytest.mark.parametrize("answer, message", [
    ({"ok": False, "error": "bad request: x"}, "gpu1: the smoke program gave no result (bad request: x)"),
    ({"levels": [{"level": "compile"}]}, "gpu1: the smoke program's answer is malformed (KeyError('status'))"),
    ({"levels": []}, "gpu1: the smoke program answered levels [], asked for ['compile']"),
])
def test_malformed_answers_are_deploy_errors(answer, message):
    plan = smoke_plan.plan_smoke(settings(""), touched_paths=TOUCHED, flags=(), log_path="l", levels=["compile"])
    with pytest.raises(DeployError) as exc:
        smoke_report.read_answer("gpu1", plan, answer)
    assert exc.value.message == message


def test_check_settings_catches_template_mistakes_before_any_push():
    host = parse_host('[host]\npython = "/p"\n[ssh]\nhost = "gpu1"\n[smoke.launch]\nmodel = "/m"\n'
                      'command = ["{python}", "x", "--topk", "{topk}"]\n', name="gpu1", source=SRC)
    with pytest.raises(BadInput, match=r"line 5: smoke.launch.topk: not set, but the launch "
                                         r"command uses \{topk\}; set topk"):
        smoke_plan.check_settings(host)
    fine = parse_host('[host]\npython = "/p"\n[ssh]\nhost = "gpu1"\n' + GPU_HOST, name="gpu1", source=SRC)
    assert smoke_plan.check_settings(fine).levels == ("compile", "import", "cli", "launch")


def test_the_smoke_stage_of_a_push_is_planned_by_the_smoke_room():
    """``plan_after_switch``: the plan the push's smoke runs, from the host, the series and the
    levels; a level an earlier run failed at is run again whatever the levels say."""
    from ddtree_deploy.engine.series import load_family

    host = parse_host('[host]\npython = "/opt/py/bin/python"\nstate_dir = "/h/.ddtree-deploy"\n[ssh]\n'
                      'host = "gpu1"\n' + GPU_HOST, name="gpu1", source=SRC)
    series = load_family(REPO / "patches/sglang-0.5.12")
    plan = smoke_plan.plan_after_switch(host, series, ["compile"], run_id="r1")
    touched, flags = smoke_plan.series_inputs(series)
    assert plan == smoke_plan.plan_smoke(smoke_settings.parse_settings(host.smoke, source=SRC), touched_paths=touched,
                                         flags=flags, levels=("compile",), source=SRC,
                                         log_path="/h/.ddtree-deploy/smoke/r1/server.log",
                                         family=smoke_settings.family_smoke(series))
    assert smoke_plan.plan_after_switch(host, series, ["compile"], run_id="r1", redo="import").levels == \
        ("compile", "import")
    assert smoke_plan.plan_after_switch(host, series, None, run_id="r1").levels == ("compile", "import", "cli",
                                                                                    "launch")
    assert smoke_plan.plan_after_switch(host, series, ["compile"], run_id="r1", heartbeat=0.5).request[
        "heartbeat_s"] == 0.5
    with pytest.raises(BadInput, match="unknown smoke level 'fly'"):
        smoke_plan.plan_after_switch(host, series, ["fly"], run_id="r1")
