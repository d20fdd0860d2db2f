"""The committed CRD (and the chart's copy) must be what the models generate."""

from __future__ import annotations

import subprocess
import sys

import yaml

from lookahead_dev import crdgen
from lookahead_operator.api.names import VERSION
from lookahead_operator.api.spec import LookaheadPolicySpec


def test_committed_crd_is_fresh():
    diffs = crdgen.check()
    assert not diffs, "stale CRD; run `python3 -m lookahead_dev.crdgen`:\n" + "\n".join(diffs)


def test_check_cli_exits_zero_when_fresh():
    proc = subprocess.run([sys.executable, "-m", "lookahead_dev.crdgen", "--check"],
                          capture_output=True, text=True, cwd=crdgen.REPO_ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_check_detects_a_stale_file(tmp_path, monkeypatch):
    stale = tmp_path / "lookaheadpolicies.yaml"
    stale.write_text(crdgen.render().replace("default: 7", "default: 8", 1))
    monkeypatch.setattr(crdgen, "CRD_PATH", stale)
    monkeypatch.setattr(crdgen, "CHART_CRD_PATH", tmp_path / "chart-copy.yaml")
    (tmp_path / "chart-copy.yaml").write_text(crdgen.render_chart())
    diffs = crdgen.check()
    assert len(diffs) == 1 and "-" in diffs[0] and "default: 8" in diffs[0]
    assert crdgen.main(["--check"]) == 1


def test_chart_copy_is_the_same_crd():
    plain = yaml.safe_load(crdgen.render())
    chart_text = crdgen.render_chart()
    inner = "\n".join(line for line in chart_text.splitlines() if not line.startswith("{{"))
    chart = yaml.safe_load(inner)
    assert chart["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    chart["metadata"].pop("annotations")
    assert chart == plain


def _walk(node, path="$"):
    yield path, node
    for key, sub in (node.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


def test_schema_is_structural():
    doc = crdgen.crd()
    version = doc["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "oneOf" not in node and "allOf" not in node and "not" not in node, path
        assert "anyOf" not in node, path
        assert "title" not in node, path
        assert ("type" in node or node.get("x-kubernetes-int-or-string")
                or node.get("x-kubernetes-preserve-unknown-fields")), f"{path} has no type"
        if node.get("type") == "object" and "properties" in node:
            assert "additionalProperties" not in node, path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            if key in node:
                assert isinstance(node[key], bool), path


def test_crd_identity_and_columns():
    doc = crdgen.crd()
    assert doc["metadata"]["name"] == "lookaheadpolicies.lookahead.dev"
    spec = doc["spec"]
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["lap"] and spec["names"]["plural"] == "lookaheadpolicies"
    version = spec["versions"][0]
    assert version["name"] == VERSION and version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Phase", "Decision", "Crossover", "Wave", "Age"]


def test_cel_rules_are_cost_bounded():
    """Every list or string a CEL rule can iterate is bounded (the apiserver estimates rule cost)."""
    schema = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for path, node in _walk(schema):
        if node.get("type") == "array":
            assert "maxItems" in node, f"{path}: list without maxItems in the spec"
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, f"{path}: string without maxLength in the spec"
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_spec_defaults_in_schema_match_the_models():
    props = crdgen.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    defaults = LookaheadPolicySpec.model_validate({"targets": {"selector": {"matchLabels": {"a": "b"}}}}).to_dict()
    # analysis.deadline has no schema default: the model gives it the mode's (30m, or 1h live),
    # which the apiserver could not (a default cannot depend on another field)
    assert "deadline" not in defaults["analysis"] and "deadline" not in props["analysis"]["default"]
    assert "default" not in props["analysis"]["properties"]["deadline"]
    for key in ("lookahead", "canary", "load", "analysis", "promotion"):
        assert props[key]["default"] == defaults[key], key
    assert props["engine"]["default"] == "auto" and props["paused"]["default"] is False
