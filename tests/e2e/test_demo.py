"""The demo's own checks (its whole flow runs from the installed wheel in test_install_wheel.py).

Which release and family it picks is pure (``demo.choose``): checked on PyPI's real listing
as cached by earlier runs, and on listings built here for the cases PyPI shows only some
days (a newer release no family covers yet, a yanked or pre-release one).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from packaging.version import Version

from ddtree_deploy import demo
from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.engine.series import families
from ddtree_deploy.release import releases
from ddtree_deploy.release.releases import Release, ReleaseFile

REPO = Path(__file__).resolve().parent.parent.parent


def _no_download_nor_sandbox(monkeypatch):
    monkeypatch.setattr(demo.releases, "ensure_wheel", lambda *a: (_ for _ in ()).throw(AssertionError("downloaded")))
    monkeypatch.setattr(demo, "make_host_env", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))


def _missing(monkeypatch, name: str) -> None:
    real = demo._installed
    monkeypatch.setattr(demo, "_installed", lambda dist: dist != name and real(dist))


def test_demo_stops_with_one_line_when_sglangs_cpu_deps_are_missing(monkeypatch, capsys):
    """An installed toolkit without torch beside it: one line and exit 2 before any download,
    sandbox or sshd (not a traceback from the import smoke level minutes later)."""
    _missing(monkeypatch, "torch")
    _no_download_nor_sandbox(monkeypatch)
    assert demo.main(["--release", "0.5.12.post1"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith("demo: torch==2.14.1 not installed here; "), out
    assert "`make demo` installs them" in out[2]  # (a checkout; the installed wheel: test_install_wheel.py)


def test_the_v2_family_needs_xgrammar_beside_the_toolkit_and_the_v1_demo_does_not(monkeypatch, capsys):
    _missing(monkeypatch, "xgrammar")
    _no_download_nor_sandbox(monkeypatch)
    assert demo.main(["--release", "0.5.23"]) == 2
    assert "demo: xgrammar==0.2.7 not installed here; " in capsys.readouterr().out
    assert demo.missing_cpu_deps("0.5.12.post1") == []


def _requirements(name: str) -> list[str]:
    return [line.strip() for line in (REPO / "requirements" / name).read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def test_the_demo_extra_is_what_make_install_puts_in_a_checkout():
    """pyproject's `demo` extra (what an installed toolkit adds for the demo: pipx inject or pip)
    is the Makefile's torch pair, requirements/sglang-cpu.txt but its test-only datasets, and
    requirements/sglang-v2-cpu.txt; V2_ONLY are the latter's (not needed before 0.5.20)."""
    import re

    makefile = (REPO / "Makefile").read_text()
    torch = re.search(r"\$\(PIP\) install -q (torch==\S+ torchvision==\S+)", makefile).group(1).split()
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["demo"]
    cpu = [r for r in _requirements("sglang-cpu.txt") if r != "datasets"]
    assert extra == [*torch, *cpu, *_requirements("sglang-v2-cpu.txt")]
    assert demo.V2_ONLY == tuple(r.split("==")[0] for r in _requirements("sglang-v2-cpu.txt"))


def test_a_release_no_family_covers_is_one_line_and_exit_2(monkeypatch, capsys):
    _no_download_nor_sandbox(monkeypatch)
    assert demo.main(["--release", "0.5.11"]) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[-1].startswith("demo: cannot tell which SGLang release to use: no family covers SGLang 0.5.11"), out


@pytest.mark.network  # the listing, fetched once into the cache (as the wheels are), then offline
def test_on_pypis_listing_the_demo_picks_0_5_23_and_the_v2_family():
    """PyPI's real listing: today's newest covered release is 0.5.23, and the family covering it
    the v2 one. The listing comes through the cache like every release the suite needs (it used
    to skip on a machine whose cache had no listing yet: a fresh clone)."""
    from ddtree_deploy.base.errors import DeployError

    try:
        listed = releases.list_releases(refresh=False)
    except DeployError as exc:  # offline with an empty cache: nothing to choose from
        pytest.skip(f"no cached SGLang release listing and PyPI is unreachable: {exc.message}")
    choice = demo.choose(listed, families())
    assert (choice.version, choice.family.name) == ("0.5.23", "sglang-0.5.20")
    assert choice.why.startswith("SGLang 0.5.23: the newest release a DDTree family covers ("), choice.why
    assert "; CUDA lane cu130 (CUDA 13.0: NVIDIA driver 580+); family sglang-0.5.20" in choice.why, choice.why
    assert "family sglang-0.5.20, because it covers " in choice.why and "v2 DFlash worker" in choice.why


def _release(version: str, *, yanked: bool = False, wheel: bool = True) -> Release:
    name = f"sglang-{version}-py3-none-any.whl" if wheel else f"sglang-{version}.tar.gz"
    return Release(Version(version), (ReleaseFile(name, f"https://example.invalid/{name}", "0" * 64, 1, yanked),))


def test_the_choice_skips_what_a_host_would_not_install_and_names_a_newer_uncovered_release():
    listed = [_release("0.5.12.post1"), _release("0.5.22"), _release("0.5.23"), _release("0.5.23.post1", yanked=True),
              _release("0.5.23.post2", wheel=False), _release("0.5.24rc1"), _release("0.5.24")]
    choice = demo.choose(listed, families())
    assert (choice.version, choice.family.name) == ("0.5.23", "sglang-0.5.20")
    assert "(PyPI's newest, 0.5.24, is covered by no family yet)" in choice.why
    # When the newest release is covered, the screen says so.
    assert "(the newest on PyPI)" in demo.choose(listed[:3], families()).why
    with pytest.raises(BadInput, match="no SGLang release on PyPI is covered"):
        demo.choose([_release("0.5.11"), _release("0.5.24")], families())


def test_release_picks_that_family_and_its_smoke_probe():
    """--release 0.5.12.post1 is the v1 demo: its family, its CPU probe, and the modules that
    import sgl_kernel left out of the import level; the v2 family's probe is its own (--device
    cuda builds ServerArgs without a GPU) and every module of it imports on CPU."""
    old, new = demo.choose([], families(), "0.5.12.post1"), demo.choose([], families(), "0.5.23")
    assert (old.family.name, new.family.name) == ("sglang-0.5.12", "sglang-0.5.20")
    assert old.why.startswith("SGLang 0.5.12.post1: asked for with --release; CUDA lane cu129 (CUDA 12.9: "
                              "NVIDIA driver 525.60.13+); family sglang-0.5.12, because")
    for choice, device, excluded in ((old, "cpu", 2), (new, "cuda", 0)):
        smoke = tomllib.loads(demo.smoke_table(choice))["smoke"]
        assert smoke["launch"]["extra_args"][:2] == ["--device", device]
        assert smoke["launch"]["extra_args"] == [*choice.family.smoke.probe_args, "--skip-tokenizer-init"]
        assert len(smoke["import_exclude"]) == excluded
        assert smoke["levels"] == ["compile", "import", "cli"]


def test_demo_models_are_the_checkouts_tiny_configs():
    """From a checkout the demo reads tests/data/models (the wheel's copy: test_install_wheel.py)."""
    for model in ("tiny-llama", "tiny-dflash-draft"):
        assert (demo.MODELS / model / "config.json").is_file()


def test_make_demo_passes_release_through():
    """docs/getting-started.md: `make demo RELEASE=0.5.12.post1` is the v1 demo; plain `make demo` chooses."""
    import subprocess

    from ddtree_testkit.system_tools import require

    require("make")  # scripts/system-deps.sh installs it: missing, the test fails, never skips

    def demo_line(*args: str) -> str:
        lines = subprocess.run(["make", "-n", "--no-print-directory", "-C", str(REPO), *args],
                               capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
        return next(line for line in lines if "ddtree_deploy.demo" in line)

    assert demo_line("demo", "RELEASE=0.5.12.post1").endswith("-m ddtree_deploy.demo --release 0.5.12.post1")
    assert demo_line("demo").endswith("-m ddtree_deploy.demo")
