"""Build hook: copy the toolkit's data (families, payload, release manifests, the example
inventory, the demo's tiny model configs) into the wheel.

The checkout keeps one copy of each at the top level (patches/, payload/,
snapshot/*/MANIFEST.json), where the CLI reads them when run from a checkout.
A built wheel gets a copy under ddtree_deploy/_data/, found by
ddtree_deploy.base.locations when the package is installed anywhere else. Copying at
build time (not symlinks into the package, which wheels do not keep) means the
wheel holds plain files; MANIFEST.in puts the same files into the sdist.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
DATA = "_data"
DEMO_MODELS = ("tiny-llama", "tiny-dflash-draft")


def data_files() -> list[tuple[Path, str]]:
    """(source file, path under ddtree_deploy/_data/) for everything the CLI reads."""
    out: list[tuple[Path, str]] = []
    for top in ("patches", "payload"):
        for f in sorted((ROOT / top).rglob("*")):
            if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".pyc":
                out.append((f, f.relative_to(ROOT).as_posix()))
    # Release manifests only: SGLang's own files are re-extracted from the cached wheel.
    for f in sorted((ROOT / "snapshot").glob("*/MANIFEST.json")):
        out.append((f, f.relative_to(ROOT).as_posix()))
    # The example inventory (`hosts list` points to it from an installed toolkit).
    for f in sorted((ROOT / "hosts").glob("*.toml")):
        out.append((f, f"examples/hosts/{f.name}"))
    # `python -m ddtree_deploy.demo`: the two tiny model configs (no weights) its cli level validates.
    for model in DEMO_MODELS:
        for f in sorted((ROOT / "tests" / "data" / "models" / model).glob("*.json")):
            out.append((f, f"models/{model}/{f.name}"))
    return out


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install runs from the checkout, which wins anyway
        dest = Path(self.build_lib) / "ddtree_deploy" / DATA
        if dest.exists():
            shutil.rmtree(dest)
        for src, rel in data_files():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, target)


setup(cmdclass={"build_py": BuildWithData})
