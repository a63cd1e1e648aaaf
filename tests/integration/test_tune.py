"""`tune`'s pure core (grid, pruning, choice rule, noise, table, results file), --apply on a
real inventory file (tomlkit), the plot file, argv building, and every bad-input line of the
CLI (exit 2, nothing launched). The sweep against a host: tests/e2e/test_tune_ssh.py.

The synthetic "host" below is the stand-in server's own performance model
(ddtree_testkit/standin_tune_server.py), evaluated directly: the planner is tested against the same
landscape the end-to-end test measures.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.settings.smoke import FamilySmoke, LaunchSettings
from ddtree_deploy.tuning import tune, run as tune_run
from ddtree_deploy.tuning.tune import Config, Measure, Record, TuneOptions

from ddtree_testkit import standin_tune_server as model  # noqa: E402  (the stand-in's documented model)

REPO = Path(__file__).resolve().parent.parent.parent


def model_tps(c: Config, conc: int) -> tuple[float, float]:
    """(tokens/s, p99 ITL ms) the stand-in's model predicts: C * accept / step; p99 ITL ~ a step."""
    algo = {"none": None, "dflash": "DFLASH", "ddtree": "DDTREE"}[c.kind]
    step = model.step_ms(algo, c.budget or 0, conc)
    return conc * model.accept_length(algo, c.budget or 0, c.topk) / step * 1000, step


def measure(c: Config, conc: int, scale: float = 1.0) -> Measure:
    tps, step = model_tps(c, conc)
    return Measure(conc, tps * scale, tps * scale / 32, 50.0, 60.0, step / 3, step, completed=8)


def sweep(opts: TuneOptions, *, fails=lambda c: False, limit: int = 200) -> list[Record]:
    """Drive next_step against the model until it says done."""
    records: list[Record] = []
    for _ in range(limit):
        step = tune.next_step(opts, records)
        if step is None:
            return records
        c = step.config
        if fails(c):
            records.append(Record(c, step.stage, "failed", step.repeat, error="OOM: exited 1"))
        else:
            scale = 1.0 + (0.01 if step.repeat else 0.0)  # a repeat measures 1% higher: the noise
            records.append(Record(c, step.stage, "ok", step.repeat,
                                  tuple(measure(c, k, scale) for k in opts.concurrency)))
    raise AssertionError("the planner did not stop")


# ------------------------------------------------------------------ grid and pruning


def test_coarse_budgets_take_every_other_and_both_ends():
    assert tune.coarse_budgets([16, 32, 64, 128, 256]) == (16, 64, 256)
    assert tune.coarse_budgets([16, 32, 64, 128]) == (16, 64, 128)
    assert tune.coarse_budgets([8]) == (8,)


def test_sweep_order_baselines_coarse_refine_repeat_and_pruning():
    opts = TuneOptions(budgets=(4, 8, 16, 32, 64, 128), topk=(1, 2, 4), concurrency=(4,), repeats=1)
    records = sweep(opts)
    stages = [r.stage for r in records]
    assert stages[:2] == ["baseline", "baseline"] and [r.config.kind for r in records[:2]] == ["dflash", "none"]
    # Stages in order, never back.
    order = ["baseline", "coarse", "refine", "repeat"]
    assert [order.index(s) for s in stages] == sorted(order.index(s) for s in stages)
    launched = {r.config for r in records if r.config.kind == "ddtree"}
    grid = {Config("ddtree", b, k) for b in opts.budgets for k in opts.topk}
    # Pruned: fewer launches than the grid, and every coarse ascent stops past its peak.
    assert len(launched) < len(grid)
    assert Config("ddtree", 128, 1) not in launched  # K=1 peaks near 8; 128 is far past
    # The model's best point on the grid is found (hill climbing on the fine budgets).
    best_on_grid = max(grid, key=lambda c: model_tps(c, 4)[0])
    assert tune.choose(opts, records).best == best_on_grid == Config("ddtree", 8, 2)
    # Noise repeats: the best two and the first baseline, once more each.
    repeats = [r.config for r in records if r.stage == "repeat"]
    choice = tune.choose(opts, records)
    assert repeats == [choice.best, choice.second, Config("dflash")]
    assert tune.pruned(opts, records) and set(tune.pruned(opts, records)) == {c.key for c in grid - launched}


def test_a_failed_launch_stops_that_top_k_and_the_sweep_goes_on():
    opts = TuneOptions(budgets=(4, 16, 64, 256), topk=(2, 4), concurrency=(8,), repeats=0)
    records = sweep(opts, fails=lambda c: c.kind == "ddtree" and c.budget >= 64)
    failed = [r.config for r in records if not r.ok]
    # One failure per top-K at most on the coarse pass: a larger budget needs more memory.
    assert Config("ddtree", 256, 2) not in {r.config for r in records}
    assert Config("ddtree", 64, 2) in failed
    assert any(r.ok and r.config.topk == 4 for r in records)  # the other top-K still ran
    assert tune.choose(opts, records).best is not None


def test_resume_replays_the_same_plan():
    """next_step is a function of the records: a sweep cut anywhere and resumed from the
    records so far launches exactly what the uninterrupted one would have."""
    opts = TuneOptions(budgets=(4, 8, 16, 32), topk=(1, 2), concurrency=(1, 4), repeats=1)
    full = sweep(opts)
    for cut in range(len(full)):
        assert tune.next_step(opts, full[:cut]).config == full[cut].config


# ------------------------------------------------------------------ the choice rule


def rec(c: Config, tps: float, itl_p99: float, conc: int = 8, repeat: int = 0, stage: str = "coarse") -> Record:
    return Record(c, stage, "ok", repeat, (Measure(conc, tps, tps / 100, 40, 80, itl_p99 / 3, itl_p99, 8),))


def test_choice_rule_excludes_itl_over_margin_and_reports_gain_margin_noise():
    opts = TuneOptions(budgets=(16, 32, 64), topk=(4,), concurrency=(8,), baselines=("dflash", "none"),
                       itl_margin_pct=25)
    d, n = Config("dflash"), Config("none")
    fast_slow_itl = Config("ddtree", 64, 4)  # the fastest, but its p99 ITL is 30% over
    good, ok = Config("ddtree", 32, 4), Config("ddtree", 16, 4)
    records = [rec(d, 1000, 40), rec(n, 700, 30), rec(fast_slow_itl, 1400, 52), rec(good, 1240, 49),
               rec(ok, 1100, 45),
               rec(good, 1200, 49, repeat=1, stage="repeat"), rec(d, 1010, 40, repeat=1, stage="repeat")]
    c = tune.choose(opts, records)
    assert c.itl_limit_ms == pytest.approx(50.0)
    assert c.best == good and c.second == ok
    assert ("ddtree-b64-k4", "p99 ITL 52.0 ms > 50.0 ms") in c.excluded
    assert c.gain_pct == pytest.approx(24.0) and c.margin_pct == pytest.approx(1240 / 1100 * 100 - 100)
    # Noise: largest relative spread among repeated configurations (good: 40 / 1220).
    assert c.noise_pct == pytest.approx(40 / 1220 * 100)
    assert c.inside_noise(c.margin_pct) is False and c.inside_noise(2.0) is True
    text = "\n".join(c.lines(25))
    assert "within 25% of DFlash chain's (<= 50.0 ms)" in text and "+24.0% vs DFlash chain" in text
    assert "inside the noise" not in text
    # A runner-up within the noise is said so.
    close = records + [rec(Config("ddtree", 16, 4), 1230, 45, repeat=0)]
    close = [r for r in close if not (r.config == ok and r.at(8).output_tps == 1100)]
    c2 = tune.choose(opts, close)
    assert c2.margin_pct == pytest.approx(1240 / 1230 * 100 - 100)
    assert "margin over the runner-up (+0.8%) is inside the noise" in "\n".join(c2.lines(25))


def test_no_qualifying_configuration_keeps_settings():
    opts = TuneOptions(budgets=(64,), topk=(4,), concurrency=(8,), baselines=("dflash",))
    c = tune.choose(opts, [rec(Config("dflash"), 1000, 40), rec(Config("ddtree", 64, 4), 1500, 90)])
    assert c.best is None and "keep the host's current settings" in "\n".join(c.lines(25))


def test_ranking_per_concurrency_with_ratio_to_each_baseline():
    opts = TuneOptions(budgets=(8, 16), topk=(2,), concurrency=(1, 8), repeats=0)
    records = sweep(opts, fails=lambda c: c.budget == 16)
    table = tune.ranking(opts, records)
    assert set(table) == {1, 8}
    top = table[8][0]
    assert top["config"] == "ddtree-b8-k2"
    d = model_tps(Config("dflash"), 8)[0]
    assert top["ratio"]["dflash"] == pytest.approx(model_tps(Config("ddtree", 8, 2), 8)[0] / d)
    assert table[8][-1]["config"] == "ddtree-b16-k2" and table[8][-1]["status"] == "failed"
    text = "\n".join(tune.table_lines(opts, records))
    assert "concurrency 1:" in text and "vs dflash" in text and "FAILED: OOM: exited 1" in text


# ------------------------------------------------------------------ the results file


def test_results_file_round_trip_torn_line_and_mismatch(tmp_path):
    opts = TuneOptions(budgets=(8,), topk=(2,), concurrency=(4,), repeats=0)
    head = tune.header("gpu1", opts, {"series": "sglang-0.5.12", "series_id": "abc"})
    path = tmp_path / "results.jsonl"
    records = sweep(opts)
    with open(path, "w") as fh:
        fh.write(json.dumps(head) + "\n")
        for r in records:
            fh.write(json.dumps(r.to_json()) + "\n")
        fh.write('{"kind": "run", "config": "ddtree-b')  # killed mid-write
    assert tune.load_results(path, head) == records
    other = tune.header("gpu1", TuneOptions(budgets=(8,), topk=(2,), concurrency=(4,), requests=50), {
        "series": "sglang-0.5.12", "series_id": "abc"})
    with pytest.raises(BadInput, match=r"results.jsonl:1: made with different bench"):
        tune.load_results(path, other)
    moved = tune.header("gpu1", opts, {"series": "sglang-0.5.12", "series_id": "NEW"})
    with pytest.raises(BadInput, match="made with different identity"):
        tune.load_results(path, moved)


# ------------------------------------------------------------------ --apply and the plot


INVENTORY = """\
# GPU host ct200 (comments and layout must survive --apply)
[ssh]
host = "ct200"   # the alias

[host]
python = "/opt/sglang/.venv/bin/python"

[smoke.launch]
model = "/models/Qwen3-8B"
budget = 64        # set by hand in March
port = 30188
# DDTREE needs flashinfer or triton
extra_args = ["--attention-backend", "flashinfer"]
"""


def test_apply_changes_only_budget_and_topk_and_shows_the_diff(tmp_path):
    from ddtree_deploy.tuning.apply import apply_launch

    path = tmp_path / "ct200.toml"
    path.write_text(INVENTORY)
    done = apply_launch(path, budget=32, topk=4)
    after = path.read_text()
    assert after == INVENTORY.replace("budget = 64        # set by hand in March",
                                      "budget = 32        # set by hand in March") + "topk = 4\n"
    assert "-budget = 64        # set by hand in March" in done["diff"] and "+topk = 4" in done["diff"]
    assert done["written"]
    again = apply_launch(path, budget=32, topk=4)
    assert not again["written"] and path.read_text() == after
    # The result still parses as the inventory it was.
    from ddtree_deploy.settings.inventory import parse_host

    host = parse_host(after, name="ct200", source=str(path))
    assert host.smoke["launch"]["budget"] == 32 and host.smoke["launch"]["topk"] == 4


def test_plot_is_a_png_with_lines_per_topk(tmp_path):
    from ddtree_deploy.tuning.plot import plot_png

    opts = TuneOptions(budgets=(4, 8, 16, 32), topk=(1, 2, 4), concurrency=(8,), repeats=0)
    records = sweep(opts, fails=lambda c: c.budget == 32 and c.topk == 4)
    path = plot_png(opts, records, tmp_path / "tune.png", title="gpu1")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


# ------------------------------------------------------------------ argv for a launch


def target(**launch) -> tune_run.Target:
    settings = LaunchSettings(model="/m", draft_model="/d", budget=64, topk=8,
                              extra_args=("--attention-backend", "flashinfer", "--speculative-dflash-block-size", "16"),
                              **launch)
    return tune_run.Target(settings, FamilySmoke(), {"name": "sglang-0.5.12"}, "0.5.12.post1")


def test_launch_argv_per_configuration():
    t = target()
    ddtree = tune_run.launch_argv(t, Config("ddtree", 32, 2))
    assert ddtree[:9] == ["{python}", "-m", "sglang.launch_server", "--model-path", "/m",
                          "--speculative-algorithm", "DDTREE", "--speculative-draft-model-path", "/d"]
    assert ddtree[9:13] == ["--speculative-ddtree-budget", "32", "--speculative-ddtree-topk", "2"]
    dflash = tune_run.launch_argv(t, Config("dflash"))
    assert "--speculative-ddtree-budget" not in dflash and "--speculative-ddtree-topk" not in dflash
    assert dflash[dflash.index("--speculative-algorithm") + 1] == "DFLASH"
    assert "--speculative-draft-model-path" in dflash and "--speculative-dflash-block-size" in dflash
    none = tune_run.launch_argv(t, Config("none"))
    assert not [a for a in none if a.startswith("--speculative")] and "/d" not in none
    assert none[-2:] == ["--attention-backend", "flashinfer"]


def test_bench_argv_is_sglang_bench_serving_offline_fixed_seed():
    opts = TuneOptions(requests=64, input_len=256, output_len=128, seed=7)
    argv = tune_run.bench_argv(LaunchSettings(model="/m", port=30188), opts)
    assert argv[:3] == ["{python}", "-m", "sglang.bench_serving"]
    joined = " ".join(argv)
    for part in ("--dataset-name random-ids", "--seed 7", "--num-prompts 64", "--random-input-len 256",
                 "--random-output-len 128", "--random-range-ratio 1.0", "--port 30188", "--model /m"):
        assert part in joined
    share = tune_run.bench_argv(LaunchSettings(model="/m"), TuneOptions(dataset="sharegpt-file",
                                                                         dataset_path="/data/sg.json"))
    assert "--dataset-name random --dataset-path /data/sg.json" in " ".join(share)


# ------------------------------------------------------------------ bad input: one line, exit 2


def cli(args, hosts_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DDTREE_DEPLOY_HOSTS": str(hosts_dir), "COLUMNS": "300"}
    return subprocess.run([sys.executable, "-m", "ddtree_deploy", "tune", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)


@pytest.fixture()
def hosts(tmp_path):
    d = tmp_path / "hosts"
    d.mkdir()
    # Unreachable on purpose: a bad-input line must come before any connection.
    base = '[ssh]\nhost = "192.0.2.1"\nconnect_timeout = 1\n[host]\npython = "/usr/bin/python3"\n'
    (d / "gpu.toml").write_text(base + '[smoke.launch]\nmodel = "/m"\ndraft_model = "/d"\n')
    (d / "nolaunch.toml").write_text(base)
    (d / "notemplate.toml").write_text(base + '[smoke.launch]\nmodel = "/m"\ncommand = ["{python}", "x.py", "--b", "{budget}"]\n')
    return d


@pytest.mark.parametrize("args, line", [
    (["--budgets", "0,16"], "--budgets: budget 0 is out of range; each must be from 1 to 1024"),
    (["--budgets", "16,x"], "--budgets: 'x' is not a whole number"),
    (["--topk", "0"], "--topk: top-K 0 is out of range"),
    (["--concurrency", "0"], "--concurrency: concurrency 0 is out of range"),
    (["--baseline", "eagle"], "--baseline: unknown baseline 'eagle'"),
    (["--budgets", "1,2,3,4,5,6,7,8,9", "--topk", "1,2,3,4,5,6,7,8"],
     "the grid is 74 launches (9 budgets x 8 top-K + 2 baselines), over 64"),
    (["--at", "5", "--concurrency", "1,8"], "--at: concurrency 5 is not among --concurrency 1,8"),
    (["--dataset", "sharegpt-file"], "--dataset sharegpt-file needs a PATH"),
    (["--dataset", "mmlu"], "--dataset: 'mmlu' is not 'random' or 'sharegpt-file=PATH'"),
])
def test_bad_options_are_one_line_exit_2(hosts, tmp_path, args, line):
    proc = cli(["--host", "gpu", *args], hosts, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert line in proc.stderr and proc.stderr.count("error:") == 1
    assert not (tmp_path / "tune-results").exists()


def test_bad_hosts_are_one_line_exit_2(hosts, tmp_path):
    proc = cli(["--host", "nolaunch"], hosts, tmp_path)
    assert proc.returncode == 2 and "nolaunch.toml: no [smoke.launch] table" in proc.stderr
    proc = cli(["--host", "notemplate"], hosts, tmp_path)
    assert proc.returncode == 2 and re.search(r"\.toml: line \d+: smoke\.launch\.command: has no \{topk\} placeholder, so tune "
                                                  r"cannot set the topk; add it to the command template", proc.stderr)
    proc = cli(["--host", "local", "--apply"], hosts, tmp_path)
    assert proc.returncode == 2 and "no inventory file to write the choice into" in proc.stderr
    # A grid over 64 with --yes passes the option checks (and then fails to connect: exit 1).
    proc = cli(["--host", "gpu", "--budgets", "1,2,3,4,5,6,7,8,9", "--topk", "1,2,3,4,5,6,7,8", "--yes"],
               hosts, tmp_path)
    assert proc.returncode == 1 and "over 64" not in proc.stderr
    # An existing results file without --resume.
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").write_text("{}\n")
    proc = cli(["--host", "gpu", "--out", str(out)], hosts, tmp_path)
    assert proc.returncode == 2 and "a results file is already there: pass --resume" in proc.stderr


def test_refine_looks_between_coarse_budgets_of_a_near_tied_top_k():
    """The demo's case (docs/tune.md): on the coarse grid B=16 K=1 is best by a hair over
    B=16 K=2, while the peak is at B=8 K=2, between two coarse budgets of the other top-K.
    Refining only around the single best would never launch it."""
    opts = TuneOptions(budgets=(4, 8, 16, 64), topk=(1, 2), concurrency=(4,), baselines=("dflash",), repeats=0)
    table = {(4, 1): 131, (8, 1): 132, (16, 1): 146.5, (64, 1): 70, (4, 2): 142, (8, 2): 170, (16, 2): 145,
             (64, 2): 72}
    records: list[Record] = []
    while (step := tune.next_step(opts, records)) is not None:
        c = step.config
        tps = 138.0 if c.kind == "dflash" else table[(c.budget, c.topk)]
        records.append(Record(c, step.stage, "ok", step.repeat, (Measure(4, tps, 4, 50, 60, 20, 80, 8),)))
    assert tune.choose(opts, records).best == Config("ddtree", 8, 2)
    assert [r.config for r in records if r.stage == "refine"][:2] == [Config("ddtree", 8, 1), Config("ddtree", 8, 2)]
