"""`ddtree-deploy image --k8s MANIFEST`: the user's Deployment or LeaderWorkerSet rendered with
the patched image, the series labels and a readiness probe on /health_generate, validated
against the Kubernetes API schemas that kubernetes-validate packages (no cluster runs here).
The CLI runs for real (the real DDTree series against 0.5.12.post1's pristine files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

import kubernetes_validate
from ddtree_deploy.cli import app

DATA = Path(__file__).resolve().parent.parent / "data" / "k8s"
BASE = "lmsysorg/sglang:v0.5.12.post1"
TAG = "registry.example.org/inference/sglang:v0.5.12.post1-ddtree"


def image(out: Path, manifest: Path, *extra: str):
    return CliRunner().invoke(app, ["image", "--base", BASE, "--release", "0.5.12.post1", "--out", str(out),
                                    "--tag", TAG, "--k8s", str(manifest), "--json", *extra])


def test_a_deployment_is_rendered_and_valid(tmp_path):
    r = image(tmp_path / "ctx", DATA / "deployment.yaml")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["k8s"]["kind"] == "Deployment" and doc["k8s"]["image"] == TAG
    out = yaml.safe_load((tmp_path / "ctx" / "k8s.yaml").read_text())
    kubernetes_validate.validate(out, kubernetes_validate.latest_version(), strict=True)  # the oracle, again
    sglang, sidecar = out["spec"]["template"]["spec"]["containers"]
    assert sglang["image"] == TAG and sidecar["image"] == "prom/statsd-exporter:v0.26.0"
    assert sglang["readinessProbe"]["httpGet"] == {"path": "/health_generate", "port": 30000}
    assert "readinessProbe" not in sidecar
    labels = out["spec"]["template"]["metadata"]["labels"]
    assert labels["io.ddtree-deploy/series"] == doc["series"] and labels["app"] == "sglang"
    assert out["spec"]["template"]["metadata"]["annotations"]["io.ddtree-deploy/series-sha256"] == doc["series_id"]
    assert out["spec"]["selector"] == {"matchLabels": {"app": "sglang"}}  # immutable: never touched


def test_a_leaderworkerset_is_rendered_and_its_templates_valid(tmp_path):
    r = image(tmp_path / "ctx", DATA / "lws.yaml")
    assert r.exit_code == 0, r.output
    out = yaml.safe_load((tmp_path / "ctx" / "k8s.yaml").read_text())
    lwt = out["spec"]["leaderWorkerTemplate"]
    leader = lwt["leaderTemplate"]["spec"]["containers"][0]
    worker = lwt["workerTemplate"]["spec"]["containers"][0]
    assert leader["image"] == TAG and worker["image"] == TAG
    assert leader["readinessProbe"]["httpGet"] == {"path": "/health_generate", "port": 40000}
    assert "readinessProbe" not in worker
    for t in (lwt["leaderTemplate"], lwt["workerTemplate"]):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "x"},
                                      "template": t}, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize("text, says", [
    ("kind: Service\napiVersion: v1\nmetadata: {name: s}\n", "holds Service (v1): --k8s renders a Deployment"),
    ("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  replicas: two\n",
     "is not valid against the Kubernetes"),
    ("apiVersion: apps/v1\nkind: Deployment\n  bad: [\n", "not valid YAML"),
])
def test_a_bad_manifest_is_one_line_exit_2_and_nothing_written(tmp_path, text, says):
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text)
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", "0.5.12.post1", "--out",
                                 str(tmp_path / "ctx"), "--tag", TAG, "--k8s", str(manifest)])
    assert r.exit_code == 2, r.output
    assert says in r.output and str(manifest) in r.output
    assert not (tmp_path / "ctx").exists()


def test_push_to_needs_build_and_tag(tmp_path):
    r = CliRunner().invoke(app, ["image", "--base", BASE, "--release", "0.5.12.post1", "--out",
                                 str(tmp_path / "ctx"), "--push-to", "registry.example.org/x:y"])
    assert r.exit_code == 2 and "--push-to registry.example.org/x:y: needs --build and --tag" in r.output
    assert not (tmp_path / "ctx").exists()


def test_push_to_tags_then_pushes_with_the_builder():
    from ddtree_deploy.interop.image import push_argvs

    assert push_argvs(("podman", "/usr/bin/podman"), "ddtree:test", "registry.example.org/t/sglang:x") == [
        ["/usr/bin/podman", "tag", "ddtree:test", "registry.example.org/t/sglang:x"],
        ["/usr/bin/podman", "push", "registry.example.org/t/sglang:x"]]
