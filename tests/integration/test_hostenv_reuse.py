"""make_host_env(..., reuse=True): one host environment written again between runs (the mutant
runner's, scripts/mutants_v2.py), against the real release wheel: nothing is rebuilt, every
overlaid file holds this call's bytes and imports as such, and what an earlier overlay wrote
and this one does not is the release's again. read_only=True (the shared build itself) is
covered by its callers (tests/integration/test_series_sglang.py, tests/integration/test_v2_server_args.py)."""

from __future__ import annotations

import os
import zipfile

from ddtree_deploy.sandbox import make_host_env, run_python
from ddtree_deploy.sandbox.hostenv import BASELINE_RELEASE, release_wheel

SHIPPED = "sglang/version.py"  # a file the release ships
ADDED = "ddtree_reuse_probe.py"  # a module it does not
UNTOUCHED = "sglang/__init__.py"  # shipped, never overlaid: re-extracted only by a rebuild


def _shipped_bytes(rel: str = SHIPPED, version: str = BASELINE_RELEASE) -> bytes:
    with zipfile.ZipFile(release_wheel(version)) as zf:
        return zf.read(rel)


def _import_x(env) -> str:
    run = run_python(env, ["-c", "import ddtree_reuse_probe as m; print(m.X)"],
                     extra_env={"PYTHONDONTWRITEBYTECODE": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip()


def test_reuse_rewrites_the_overlay_only_and_restores_what_it_no_longer_holds(tmp_path):
    dest = tmp_path / "host"
    env = make_host_env(dest, overlay={SHIPPED: b"# mutant\n", ADDED: b"X = 1\n"},
                        version=BASELINE_RELEASE, reuse=True)
    site = env.site_packages
    assert _import_x(env) == "1"
    assert list(site.glob("__pycache__/ddtree_reuse_probe.*.pyc"))  # its bytecode, cached
    touched = site / UNTOUCHED
    touched.write_bytes(touched.read_bytes() + b"# touched\n")
    before = os.stat(site / ADDED)

    # Same size, and (as two runs within one second would) the same modification time.
    again = make_host_env(dest, overlay={SHIPPED: b"# mutant\n", ADDED: b"X = 2\n"},
                          version=BASELINE_RELEASE, reuse=True)
    assert again == env and touched.read_bytes().endswith(b"# touched\n")
    os.utime(site / ADDED, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert _import_x(env) == "2"  # not the previous module's bytecode

    make_host_env(dest, overlay={}, version=BASELINE_RELEASE, reuse=True)
    assert (site / SHIPPED).read_bytes() == _shipped_bytes()
    assert not (site / ADDED).exists()
    assert touched.read_bytes().endswith(b"# touched\n")  # still not rebuilt


def test_reuse_of_another_release_or_an_old_marker_builds_afresh(tmp_path):
    dest = tmp_path / "host"
    env = make_host_env(dest, overlay={SHIPPED: b"# mutant\n"}, version=BASELINE_RELEASE,
                        reuse=True)
    touched = env.site_packages / UNTOUCHED
    touched.write_bytes(touched.read_bytes() + b"# touched\n")
    make_host_env(dest, overlay={SHIPPED: b"# mutant\n"}, version="0.5.12", reuse=True)
    assert touched.read_bytes() == _shipped_bytes(UNTOUCHED, "0.5.12")  # another release
    touched.write_bytes(touched.read_bytes() + b"# touched\n")
    (dest / "ddtree-host-env.txt").write_text(BASELINE_RELEASE)  # an older toolkit's marker
    make_host_env(dest, overlay={ADDED: b"X = 3\n"}, version=BASELINE_RELEASE, reuse=True)
    assert touched.read_bytes() == _shipped_bytes(UNTOUCHED)
    assert (env.site_packages / SHIPPED).read_bytes() == _shipped_bytes()
    assert _import_x(env) == "3"
