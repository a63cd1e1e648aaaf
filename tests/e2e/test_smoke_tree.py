"""The tree probe of the import and cli smoke levels, on the REAL SGLang 0.5.12.post1 files
patched by the real series (and the real 0.5.23 patched by the v2 family, below), over a
real sshd on loopback: "never silently linear".

The host Python is a venv with the release wheel's files, the series applied to them (in
memory, by the toolkit's own check) and the project venv's CPU dependencies shared
(ddtree_deploy/sandbox/hostenv.py). Resolving the worker class imports ``dflash_worker``, which imports
``sgl_kernel`` (CUDA): the host gets ``sglang_host.write_kernel_standin``, a named STAND-IN
whose every kernel raises when called (nothing here calls one). Everything else is real:
argparse, ``ServerArgs`` and its DDTREE validation, ``SpeculativeAlgorithm.from_string`` and
``create_worker``.

The marker ``DDTREE_TREE_VERIFY = True`` (CONTRACTS.md) is not in patch 0005 yet; the
fixtures add it to (or strip it from) the patched ``dflash_worker.py`` themselves, so each
case holds whether or not the patch carries it. A partial port that keeps DFlash's verify
width (the draft block) is made by wrapping ``ServerArgs.__post_init__`` (TEST FIXTURE).
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from ddtree_deploy.engine.check import check_series
from ddtree_deploy.engine.series import PatchEntry, load_family
from ddtree_deploy.release import releases
from ddtree_deploy.remote.transport import transport_for
from ddtree_deploy.settings import smoke as smoke_settings
from ddtree_deploy.settings.inventory import load_host
from ddtree_deploy.smoke import plan as smoke_plan, run as smoke_run

from ddtree_deploy.sandbox import SandboxHost, hostenv as sglang_host

pytestmark = [pytest.mark.sshd, pytest.mark.sglang_env]

REPO = Path(__file__).resolve().parent.parent.parent
FAMILY = REPO / "patches" / "sglang-0.5.12"
MODELS = REPO / "tests" / "data" / "models"
WORKER = "sglang/srt/speculative/dflash_worker.py"
SERVER_ARGS = "sglang/srt/server_args.py"
MARKER = re.compile(r"^\s*DDTREE_TREE_VERIFY\s*=\s*True\s*(#.*)?\n", re.M)

# TEST FIXTURE: a partial port whose DDTREE keeps the chain's verify width (the draft block).
CHAIN_WIDTH = textwrap.dedent('''

    # TEST FIXTURE (tests/e2e/test_smoke_tree.py): a partial port that leaves DDTREE with
    # DFlash's verify width, the draft block.
    _ddtree_fixture_post_init = ServerArgs.__post_init__


    def _ddtree_fixture_chain_width(self, *args, **kwargs):
        _ddtree_fixture_post_init(self, *args, **kwargs)
        if self.speculative_algorithm == "DDTREE":
            self.speculative_num_draft_tokens = self.speculative_dflash_block_size


    ServerArgs.__post_init__ = _ddtree_fixture_chain_width
''')


def with_marker(text: str) -> str:
    """The patched worker with the marker line the lead adds to patch 0005 (if absent)."""
    if MARKER.search(text):
        return text
    head = '    """DFlash speculative decoding worker (spec-v1, tp>=1/pp=1)."""\n'
    assert head in text, "DFlashWorker's docstring moved: update this fixture"
    return text.replace(head, head + "\n    # DDTREE resolves to this worker, which then verifies a tree.\n"
                                     "    DDTREE_TREE_VERIFY = True\n", 1)


def without_marker(text: str) -> str:
    return MARKER.sub("", text)


@pytest.fixture(scope="module")
def series():
    return load_family(FAMILY, payload_dir=REPO / "payload")


@pytest.fixture(scope="module")
def patched(series) -> dict[str, bytes]:
    wheel = sglang_host.release_wheel()
    wanted = series.touched_paths()
    found = releases.read_wheel_files(wheel, wanted)
    report = check_series(series, {p: found.get(p) for p in wanted})
    assert report.ok
    return {p: f.patched for p, f in report.patched.items()}


def sandbox_tree_host(sshd, root: Path, name: str, overlay: dict[str, bytes], *, version: str,
                      device: str):
    """A host on ``sshd``: the patched release, the kernel stand-in, tiny model folders for
    the cli level (launched with ``--device <device>``); (SandboxHost, its inventory's Host)."""
    env = sglang_host.make_host_env(root / "env", overlay=overlay, version=version)
    sglang_host.write_kernel_standin(env.site_packages)  # STAND-IN for sgl_kernel (CUDA)
    test_host = SandboxHost(name=name, server=sshd, python=env.python, site=env.site_packages,
                            state_dir=root / "state")
    return test_host, tree_host_inventory(test_host, root / "hosts", device=device)


def tree_host_inventory(test_host, hosts: Path, *, device: str, model: str = "tiny-llama",
                        extra: tuple[str, ...] = ()):
    """An inventory for ``test_host`` whose cli level resolves the launch of ``model``."""
    inv = test_host.inventory(hosts)
    args = ", ".join(f'"{a}"' for a in ("--device", device, "--attention-backend", "triton",
                                        "--skip-tokenizer-init", *extra))
    with open(inv, "a") as fh:
        fh.write(textwrap.dedent(f"""
            [smoke]
            levels = ["import", "cli"]
            [smoke.launch]
            model = "{MODELS / model}"
            draft_model = "{MODELS / 'tiny-dflash-draft'}"
            budget = 20
            extra_args = [{args}]
            gpu = false
        """))
    return load_host(str(inv))


@pytest.fixture(scope="module")
def tree_host(sshd, patched, tmp_path_factory):
    """One host: the patched 0.5.12.post1 release."""
    return sandbox_tree_host(sshd, tmp_path_factory.mktemp("tree-host"), "h-tree", patched,
                             version="0.5.12.post1", device="cpu")


def run_levels(tree_host, series, levels, files: dict[str, str], *, probe_only=False):
    """Write ``files`` (package-relative -> text) on the host, then run ``levels`` over SSH.

    ``probe_only``: the import level imports spec_info only before its tree probe (the
    failure cases are about the probe; the passing case imports every module, and this
    machine's two cores are shared)."""
    test_host, host = tree_host
    for rel, text in files.items():
        test_host.file(rel).write_text(text)
    settings = smoke_settings.parse_settings(host.smoke, source=host.source)
    texts = [e.file.read_text() for e in series.entries if isinstance(e, PatchEntry)]
    plan = smoke_plan.plan_smoke(settings, touched_paths=series.touched_paths(), flags=smoke_plan.series_flags(texts),
                            log_path="-", levels=levels, source=host.source, family=smoke_settings.family_smoke(series))
    if probe_only:
        plan.request["import"]["modules"] = ["sglang.srt.speculative.spec_info"]
    return smoke_run.run_on_host(host, transport_for(host), plan)


def test_tree_worker_with_marker_and_budget_width_passes(tree_host, series, patched):
    report = run_levels(tree_host, series, ["import", "cli"], {
        WORKER: with_marker(patched[WORKER].decode()), SERVER_ARGS: patched[SERVER_ARGS].decode()})
    assert report.ok, (report.lines(), report.levels[0].evidence.get("tree"))
    imported, cli = report.levels
    assert imported.detail.endswith("; DDTREE verify width 25 = budget 24 + 1; "
                                    "DDTREE -> DFlashWorker (DDTREE_TREE_VERIFY = True)")
    probe = imported.evidence["tree"]
    assert probe["worker"] == {"name": "DFlashWorker", "module": "sglang.srt.speculative.dflash_worker",
                               "marker": "True", "tree": True}
    assert probe["block"] == 16 and "--speculative-ddtree-budget" in probe["argv"]
    # The host's own launch settings (tiny models on the host, budget 20) resolve to width 21.
    assert cli.detail.endswith("prepare_server_args accepts the launch arguments; verify width 21 = budget 20 + 1")
    assert cli.evidence["validation"]["fields"]["speculative_num_draft_tokens"] == 21


def test_worker_without_marker_is_silently_linear(tree_host, series, patched):
    report = run_levels(tree_host, series, ["import", "cli"], {
        WORKER: without_marker(patched[WORKER].decode()), SERVER_ARGS: patched[SERVER_ARGS].decode()},
        probe_only=True)
    assert [r.status for r in report.levels] == ["failed", "skipped"]
    assert report.failed.detail == (
        "DDTREE probe: DDTREE resolves to sglang.srt.speculative.dflash_worker.DFlashWorker, whose "
        "DDTREE_TREE_VERIFY is None, not True: that worker does not verify a tree (silently linear)")


def test_partial_port_with_the_chain_width_fails_import_and_cli(tree_host, series, patched):
    files = {WORKER: with_marker(patched[WORKER].decode()),
             SERVER_ARGS: patched[SERVER_ARGS].decode() + CHAIN_WIDTH}
    report = run_levels(tree_host, series, ["import"], files, probe_only=True)
    assert report.failed.detail == (
        "DDTREE probe: speculative_num_draft_tokens resolved to 16, expected 25 (--speculative-ddtree-budget 24 "
        "+ 1): that is the draft block, so DDTREE verifies a chain (the linear DFlash path)")
    report = run_levels(tree_host, series, ["cli"], {})
    assert report.failed.detail == (
        "the launch arguments resolve speculative_num_draft_tokens to 16, expected 21 "
        "(--speculative-ddtree-budget 20 + 1): DDTREE would not verify its tree")


def test_worker_class_other_than_the_family_names_fails(tree_host, series, patched):
    # A family whose [smoke] expects another class (as the v2 family expects DDTreeWorkerV2).
    from dataclasses import replace

    test_host, host = tree_host
    for rel in (WORKER, SERVER_ARGS):
        test_host.file(rel).write_text(with_marker(patched[rel].decode()) if rel == WORKER else patched[rel].decode())
    settings = smoke_settings.parse_settings(host.smoke, source=host.source)
    family = replace(smoke_settings.family_smoke(series), worker_class="DDTreeWorkerV2")
    plan = smoke_plan.plan_smoke(settings, touched_paths=series.touched_paths(), flags=(), log_path="-",
                            levels=["import"], family=family)
    plan.request["import"]["modules"] = ["sglang.srt.speculative.spec_info"]
    report = smoke_run.run_on_host(host, transport_for(host), plan)
    assert report.failed.detail == (
        "DDTREE probe: DDTREE resolves to worker class sglang.srt.speculative.dflash_worker.DFlashWorker, "
        "expected DDTreeWorkerV2 (the family's [smoke] worker_class)")


# ------------------------------------------------------------------ the v2 family on 0.5.23
# The real v2 series (patches/sglang-0.5.20) on the real 0.5.23 wheel: DDTREE is a registered
# plugin algorithm, arguments resolve through resolve_once and are read through resolving_view.
# The partial ports issue #13 names are TEST FIXTURES appended to the deployed plugin module:
# DDTREE resolved by DFlash's own _handle_dflash (the chain's width), or served by plain
# DFlashWorkerV2.

FAMILY_V2 = REPO / "patches" / "sglang-0.5.20"
PLUGIN = "sglang/srt/speculative/ddtree_v2_plugin.py"

V2_DFLASH_RESOLUTION = textwrap.dedent('''

    # TEST FIXTURE (tests/e2e/test_smoke_tree.py): a partial port -- DDTREE resolved as DFLASH.
    def _fixture_dflash_resolution(self, server_args):
        from sglang.srt.arg_groups.speculative_hook import _handle_dflash

        _handle_dflash(server_args)


    type(_registered_ddtree_fixture()).handle_server_args = _fixture_dflash_resolution
''')
V2_CHAIN_WORKER = textwrap.dedent('''

    # TEST FIXTURE (tests/e2e/test_smoke_tree.py): a partial port -- DDTREE served by DFlashWorkerV2.
    def _fixture_chain_worker(self, server_args):
        from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

        return DFlashWorkerV2


    type(_registered_ddtree_fixture()).create_worker = _fixture_chain_worker
''')
V2_FIXTURE_HEAD = textwrap.dedent('''

    def _registered_ddtree_fixture():
        from sglang.srt.speculative.spec_registry import get_spec

        return get_spec("DDTREE")
''')


@pytest.fixture(scope="module")
def series_v2():
    return load_family(FAMILY_V2, payload_dir=REPO / "payload")


@pytest.fixture(scope="module")
def patched_v2(series_v2) -> dict[str, bytes]:
    wheel = sglang_host.release_wheel("0.5.23")
    wanted = series_v2.touched_paths()
    found = releases.read_wheel_files(wheel, wanted)
    report = check_series(series_v2, {p: found.get(p) for p in wanted})
    assert report.ok
    return {p: f.patched for p, f in report.patched.items()}


@pytest.fixture(scope="module")
def tree_host_v2(sshd, patched_v2, tmp_path_factory):
    # 0.5.14+: DFlash's resolution refuses --device cpu; resolving with cuda needs no GPU.
    return sandbox_tree_host(sshd, tmp_path_factory.mktemp("tree-host-v2"), "h-tree-v2", patched_v2,
                             version="0.5.23", device="cuda")


HYBRID_SAID = ("recurrent tree path on (speculative_eagle_topk 8 > 1), accepted node's state committed by "
               "sglang.srt.speculative.spec_utils.commit_mamba_states_after_verify")


def test_v2_family_resolves_ddtree_to_its_tree_worker(tree_host_v2, series_v2, patched_v2):
    report = run_levels(tree_host_v2, series_v2, ["import", "cli"], {PLUGIN: patched_v2[PLUGIN].decode()})
    assert report.ok, report.lines()
    imported, cli = report.levels
    # The tiny llama, then the tiny hybrid target (Qwen3-Next, GDN layers): the recurrent tree
    # path on, with the hook that commits the accepted node's state.
    assert imported.detail.endswith("; DDTREE verify width 25 = budget 24 + 1; "
                                    "DDTREE -> DDTreeWorkerV2 (DDTREE_TREE_VERIFY = True); "
                                    "hybrid Qwen3NextConfig (gdn): " + HYBRID_SAID)
    assert imported.evidence["tree"]["worker"]["module"] == "sglang.srt.speculative.ddtree_worker_v2"
    assert imported.evidence["tree"]["hybrid"]["report"]["recurrent_backend"] == "GDNAttnBackend"
    # The host's launch arguments, resolved by resolve_once and read through resolving_view.
    assert cli.detail.endswith("verify width 21 = budget 20 + 1")


def test_v2_cli_level_shows_a_hybrid_hosts_recurrent_tree_path(tree_host_v2, series_v2, patched_v2,
                                                               tmp_path):
    # The same host, its inventory's model a hybrid one: no flag, the tree path shown.
    test_host, _ = tree_host_v2
    host = tree_host_inventory(test_host, tmp_path / "hosts", device="cuda", model="tiny-qwen3-next",
                               extra=("--disable-radix-cache",))
    report = run_levels((test_host, host), series_v2, ["cli"], {PLUGIN: patched_v2[PLUGIN].decode()})
    assert report.ok, report.lines()
    assert report.levels[0].detail.endswith(
        "verify width 21 = budget 20 + 1; hybrid Qwen3NextConfig (gdn): " + HYBRID_SAID)


def test_v2_partial_ports_fail_the_probe(tree_host_v2, series_v2, patched_v2):
    plugin = patched_v2[PLUGIN].decode() + V2_FIXTURE_HEAD
    report = run_levels(tree_host_v2, series_v2, ["import"], {PLUGIN: plugin + V2_DFLASH_RESOLUTION},
                        probe_only=True)
    assert report.failed.detail == (
        "DDTREE probe: speculative_num_draft_tokens resolved to 16, expected 25 (--speculative-ddtree-budget 24 "
        "+ 1): that is the draft block, so DDTREE verifies a chain (the linear DFlash path)")
    report = run_levels(tree_host_v2, series_v2, ["import"], {PLUGIN: plugin + V2_CHAIN_WORKER}, probe_only=True)
    assert report.failed.detail == (
        "DDTREE probe: DDTREE resolves to worker class sglang.srt.speculative.dflash_worker_v2.DFlashWorkerV2, "
        "expected DDTreeWorkerV2 (the family's [smoke] worker_class)")
