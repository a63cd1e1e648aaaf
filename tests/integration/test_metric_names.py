"""The metric names of ddtree_deploy/release/metric_names.py held to each covered release.

Every pinned name is read from the release's own wheel (the project's cache; downloaded
once): it must be declared in SGLang's ``sglang/srt`` sources as the kind pinned
(``Gauge(name="sglang:...")``, ``Counter``, ``Histogram``), as the CUDA kernel contract is
pinned in tests/integration/test_v2_kernel_contract.py. A release that renames or drops a metric the
served figures read fails here, naming the release, the field and the name; a metric
pinned as absent (``num_draft_tokens`` before 0.5.13) that a release gains fails too, so
the table is brought up to date.
"""

from __future__ import annotations

import re
import zipfile

import pytest
from packaging.version import Version

from ddtree_deploy.base.errors import BadInput
from ddtree_deploy.release import metric_names as mn

# SGLang's collectors bind the classes to local names (``Gauge = self._gauge_cls or
# _PromGauge``) and call them with the name as a keyword: ``Gauge(name="sglang:x", ...)``.
DECLARED = re.compile(r"\b(Gauge|Counter|Histogram|Summary)\(\s*name=\"(sglang:[A-Za-z0-9_]+)\"")
KINDS = {"Gauge": mn.GAUGE, "Counter": mn.COUNTER, "Histogram": mn.HISTOGRAM, "Summary": "summary"}


def declared(version: str) -> dict[str, set[str]]:
    """name -> the kinds it is declared as, in the release's sglang/srt sources."""
    from ddtree_deploy.sandbox import release_wheel

    out: dict[str, set[str]] = {}
    with zipfile.ZipFile(release_wheel(version)) as zf:
        for path in zf.namelist():
            if path.startswith("sglang/srt/") and path.endswith(".py"):
                for kind, name in DECLARED.findall(zf.read(path).decode("utf-8", "replace")):
                    out.setdefault(name, set()).add(KINDS[kind])
    return out


@pytest.mark.parametrize("version", sorted(mn.PINNED))
def test_every_pinned_name_is_declared_in_the_release(version):
    names = mn.PINNED[version]
    assert names.release == version
    found = declared(version)
    wrong = []
    for field, (name, kind) in names.kinds().items():
        if name not in found:
            wrong.append(f"{field}: {name} is not declared (renamed or gone)")
        elif kind not in found[name]:
            wrong.append(f"{field}: {name} is declared as {sorted(found[name])}, pinned as {kind}")
    newest = mn.PINNED[max(mn.PINNED, key=Version)]
    for field in mn.KIND:
        later = getattr(newest, field)
        if getattr(names, field) is None and later in found:
            wrong.append(f"{field}: pinned absent, but the release declares {later}: pin it")
    assert not wrong, f"sglang {version} changed the metrics the served figures read:\n" + "\n".join(wrong)


def test_a_renamed_metric_is_caught():
    """The check itself, on a made-up rename: the pinned name is then not declared."""
    found = declared("0.5.23")
    renamed = {k: v for k, v in found.items() if k != "sglang:spec_accept_length"}
    renamed["sglang:spec_accept_len"] = {mn.GAUGE}
    names = mn.PINNED["0.5.23"]
    missing = [name for name, _ in names.kinds().values() if name not in renamed]
    assert missing == ["sglang:spec_accept_length"]


def test_names_for_a_release():
    assert mn.names_for("0.5.12.post1").num_draft_tokens is None
    assert mn.names_for("0.5.13").num_draft_tokens == "sglang:spec_num_draft_tokens"
    # A release after the table: the newest pinned row, which says which it is.
    assert mn.names_for("0.5.30").release == "0.5.23"
    assert mn.names_for("0.5.23.post1").release == "0.5.23"
    with pytest.raises(BadInput, match="no metric names are pinned for a release before 0.5.12"):
        mn.names_for("0.5.11")
    with pytest.raises(BadInput, match="is not an SGLang version"):
        mn.names_for("latest")


def test_sample_names():
    assert mn.sample_name("sglang:num_requests_total", mn.COUNTER) == "sglang:num_requests_total"
    assert mn.sample_name("sglang:x", mn.COUNTER) == "sglang:x_total"
    assert mn.sample_name("sglang:num_running_reqs", mn.GAUGE) == "sglang:num_running_reqs"
