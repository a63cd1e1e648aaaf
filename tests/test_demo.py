"""The demo's own checks (its whole flow runs from the installed wheel in test_install_wheel.py)."""

from __future__ import annotations

import importlib.util

from ddtree_deploy import demo


def test_demo_stops_with_one_line_when_sglangs_cpu_deps_are_missing(monkeypatch, capsys):
    """An installed toolkit without torch beside it: one line and exit 2 before any download,
    sandbox or sshd (not a traceback from the import smoke level minutes later)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    monkeypatch.setattr(demo.releases, "ensure_wheel", lambda *a: (_ for _ in ()).throw(AssertionError("downloaded")))
    monkeypatch.setattr(demo, "make_host_env", lambda *a, **k: (_ for _ in ()).throw(AssertionError("built")))
    assert demo.main() == 2
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and out[1].startswith("demo: torch not importable here; "), out


def test_demo_models_are_the_checkouts_tiny_configs():
    """From a checkout the demo reads tests/data/models (the wheel's copy: test_install_wheel.py)."""
    for model in ("tiny-llama", "tiny-dflash-draft"):
        assert (demo.MODELS / model / "config.json").is_file()
