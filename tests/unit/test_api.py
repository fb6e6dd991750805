"""The API models: manifests parse, bad ones are refused naming the field, the CRD matches the models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kompile.api import ManifestError, load_manifest, parse_manifest
from kompile.api.crd import CRD_FILENAME, build_crd, render_crd
from kompile.api.resource import load_manifests
from kompile.api.status import (
    CompiledModelStatus,
    LatencyStats,
    TargetStatus,
    Thresholds,
    ValidationResult,
    set_condition,
    summarize,
)

ROOT = Path(__file__).resolve().parents[2]


def minimal() -> dict:
    return {
        "apiVersion": "kompile.dev/v1alpha1",
        "kind": "CompiledModel",
        "metadata": {"name": "m"},
        "spec": {
            "source": {"uri": "python://models.small:small_cnn"},
            "inputs": [{"name": "input", "shape": [1, 3, 8, 8]}],
            "targets": [{"name": "cpu", "backend": "onnxruntime"}],
        },
    }


@pytest.mark.parametrize("path", sorted((ROOT / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_parses(path: Path) -> None:
    cm = load_manifest(path)
    assert cm.metadata.name


def test_defaults_fill_in() -> None:
    cm = parse_manifest(minimal())
    assert cm.spec.targets and cm.spec.targets[0].precision == "fp32"
    assert cm.spec.benchmark.batch_sizes == [1]
    assert cm.spec.validation.samples >= 1


@pytest.mark.parametrize(
    ("mutate", "field", "phrase"),
    [
        (lambda d: d["spec"].pop("targets"), "spec", "spec.targets or set spec.fleet.enabled"),
        (
            lambda d: d["spec"]["targets"][0].update(backend="mxnet"),
            "spec.targets[0].backend",
            "unknown backend 'mxnet'; use auto or one of",
        ),
        (
            lambda d: d["spec"]["targets"][0].update(options={"optlevel": "all"}),
            "spec.targets[0]",
            "unknown onnxruntime option(s) ['optlevel']",
        ),
        (
            lambda d: d["spec"]["targets"][0].update(options={"optLevel": "fastest"}),
            "spec.targets[0]",
            "option optLevel='fastest': use one of ['extended', 'all', 'basic']",
        ),
        (
            lambda d: d["spec"]["targets"][0].update(precision="fp64"),
            "spec.targets[0].precision",
            "Input should be",
        ),
        (lambda d: d["spec"]["inputs"][0].update(shape=[-1, 3]), "spec.inputs[0]", "dynamicDims"),
        (lambda d: d["spec"]["inputs"][0].update(dtype="float64"), "spec.inputs[0].dtype", "Input should be"),
        (
            lambda d: d["spec"].update(benchmark={"iterations": 0}),
            "spec.benchmark.iterations",
            "greater than",
        ),
        (  # inputs sharing a dim name share its size: an LSTM's state guessed apart from its tokens
            lambda d: d["spec"].update(
                inputs=[
                    {
                        "name": "tokens",
                        "dtype": "int64",
                        "shape": [-1, 8],
                        "dynamicDims": [{"axis": 0, "name": "batch", "min": 1, "opt": 1, "max": 32}],
                    },
                    {
                        "name": "h0",
                        "shape": [2, -1, 8],
                        "dynamicDims": [{"axis": 1, "name": "batch", "min": 1, "opt": 16, "max": 256}],
                    },
                ]
            ),
            "spec.inputs",
            "dim 'batch' is 1:1:32 in input 'tokens' and 1:16:256 in input 'h0' (min:opt:max)",
        ),
        (lambda d: d["spec"].update(rollout={"enabled": True}), "spec", "needs spec.registry"),
        (lambda d: d["spec"]["source"].update(uri=""), "spec.source.uri", "at least 1"),
        (lambda d: d["spec"]["source"].update(digest="md5:abc"), "spec.source.digest", "pattern"),
        (lambda d: d["spec"].update(sorce={}), "spec.sorce", "unknown field"),
        (lambda d: d["spec"]["targets"][0].update(name="CPU_1"), "spec.targets[0].name", "pattern"),
        (
            lambda d: d["spec"]["targets"][0].update(quantization="static"),
            "spec.targets[0]",
            "only to precision int8",
        ),
        (
            lambda d: d["spec"]["targets"].append({"name": "cpu", "backend": "onnxruntime"}),
            "spec",
            "duplicate",
        ),
        (  # a backend named where an object is expected: the message shows how to write it
            lambda d: d["spec"]["targets"][0].update(backend="auto", candidates=["onnxruntime", "openvino"]),
            "spec.targets[0].candidates[0]",
            "a mapping, not the string 'onnxruntime': write {backend: onnxruntime}",
        ),
        (
            lambda d: d["spec"].update(benchmark="fast"),
            "spec.benchmark",
            "a mapping, not the string 'fast'",
        ),
        (  # `validation:` with nothing under it
            lambda d: d["spec"].update(validation=None),
            "spec.validation",
            "empty (the key has no value): give it its fields, or delete the key",
        ),
    ],
)
def test_invalid_manifest_names_the_field(mutate, field: str, phrase: str) -> None:  # type: ignore[no-untyped-def]
    doc = minimal()
    mutate(doc)
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc, "m.yaml")
    text = str(info.value)
    assert f"- {field}" in text, text
    assert phrase in text, text


@pytest.mark.parametrize(
    ("written", "hint"),
    [
        ("{tuningTrials: 0}", 'tuningTrials: "0"'),
        ("{fastMath: off}", "YAML reads an unquoted"),
        ("{tuningMinutes: 2.5}", 'tuningMinutes: "2.5"'),
    ],
)
def test_an_unquoted_option_value_is_refused_saying_to_quote_it(
    tmp_path: Path, written: str, hint: str
) -> None:
    # Options are a map of strings (as in the CRD); YAML turns 0, 2.5, on/off, yes/no into numbers
    # and booleans, which pydantic alone reports as "Input should be a valid string".
    doc = minimal()
    doc["spec"]["targets"][0].update(backend="tvm")
    text = yaml.safe_dump(doc).replace("backend: tvm", f"backend: tvm\n    options: {written}")
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(ManifestError) as info:
        load_manifest(path)
    message = str(info.value)
    assert "- spec.targets[0].options." in message and "option values are strings" in message, message
    assert hint in message, message


@pytest.mark.parametrize(
    ("where", "value", "says"),
    [
        (("spec", "registry", "modelName"), "team-b/bert", "no '/', ':' or '\\'"),
        (("spec", "registry", "modelName"), "..", "not only dots"),
        (("metadata", "name"), "ResNet_50", "a DNS label"),
        (("spec", "targets", 0, "name"), "CPU_FP32", "a DNS label"),
    ],
)
def test_a_value_off_its_pattern_is_refused_saying_what_the_field_takes(
    where: tuple[str | int, ...], value: str, says: str
) -> None:
    """pydantic alone prints the regular expression ("String should match pattern '^[^/:\\\\]*...'"):
    the error quotes the value and the field's description instead. A model name with '/' used to
    pass, compile every target, and be refused by MLflow at registration; '..' wrote the store's
    latest/ pointer into another namespace's folder."""
    doc = minimal()
    doc["spec"]["registry"] = {}
    at: Any = doc
    for part in where[:-1]:
        at = at[part]
    at[where[-1]] = value
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc)
    message = str(info.value)
    assert f"{value!r} is not allowed here" in message and says in message, message


def test_wrong_kind_is_refused() -> None:
    doc = minimal() | {"kind": "Deployment"}
    with pytest.raises(ManifestError, match="kind: CompiledModel"):
        parse_manifest(doc)


def test_a_file_of_several_models_names_them_and_runs_the_one_picked(tmp_path: Path) -> None:
    """A GitOps file holds several CompiledModels (and other kinds) as kubectl apply takes them:
    `kompile run` said only 'expected exactly one CompiledModel document, found 2'."""
    from typer.testing import CliRunner

    from kompile.cli import app

    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "models"}}
    second = minimal() | {"metadata": {"name": "m2"}}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all([namespace, minimal(), second]))
    with pytest.raises(ManifestError, match=r"holds 2 CompiledModels \(m, m2\): pick one with --name m"):
        load_manifest(path)
    assert load_manifest(path, "m2").metadata.name == "m2"
    with pytest.raises(ManifestError, match=r"no CompiledModel named 'm3' in it \(it holds: m, m2\)"):
        load_manifest(path, "m3")
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 0, checked.stderr
    assert "valid CompiledModel 'm'" in checked.stderr and "valid CompiledModel 'm2'" in checked.stderr
    refused = CliRunner().invoke(app, ["run", str(path), "--name", "m3"])
    assert refused.exit_code == 2 and "it holds: m, m2" in refused.stderr
    path.write_text(yaml.safe_dump(namespace))
    with pytest.raises(ManifestError, match="got apiVersion: 'v1', kind: 'Namespace'"):
        load_manifest(path)


def test_check_reports_every_invalid_model_of_a_file_by_name(tmp_path: Path) -> None:
    """A GitOps repository's CI runs `kompile check` on a file of several models: it said the first
    error only, without saying which model it was in ("fleet.yaml: invalid CompiledModel manifest")."""
    from typer.testing import CliRunner

    from kompile.cli import app

    bad_name = minimal() | {"metadata": {"name": "Bad_Name"}}
    bad_precision = minimal() | {"metadata": {"name": "m3"}}
    bad_precision["spec"] = bad_precision["spec"] | {
        "targets": [{"name": "t", "backend": "onnxruntime", "precision": "fp64"}]
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump_all([minimal(), bad_name, bad_precision]))
    checked = CliRunner().invoke(app, ["check", str(path)])
    assert checked.exit_code == 2, checked.stderr
    said = checked.stderr
    assert "CompiledModel 'Bad_Name' (document 2)" in said and "metadata.name" in said, said
    assert "CompiledModel 'm3' (document 3)" in said and "spec.targets[0].precision" in said, said
    assert "'m' (document 1)" not in said, said
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(bad_name))
    with pytest.raises(ManifestError, match=r"one.yaml: invalid CompiledModel manifest"):
        load_manifest(tmp_path / "one.yaml")  # a file of one model names no document


def test_check_takes_a_gitops_folder_and_several_files(tmp_path: Path) -> None:
    """A GitOps repository's CI checks its tree: `kompile check deploy/` said "a folder without
    config.json", and two files were "unexpected extra argument(s)". A folder's YAML files that
    hold no CompiledModel (a kustomization, a Helm template) are not its business; every invalid
    model is reported, each with its file, and the exit is 2 when any is."""
    from typer.testing import CliRunner

    from kompile.cli import app

    deploy = tmp_path / "deploy"
    (deploy / "team-a").mkdir(parents=True)
    (deploy / ".git").mkdir()
    (deploy / "team-a" / "models.yaml").write_text(
        yaml.safe_dump_all([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}, minimal()])
    )
    (deploy / "team-a" / "kustomization.yaml").write_text("resources: [models.yaml]\n")
    (deploy / "chart.yaml").write_text("name: {{ .Values.name }}\n")  # a template: not YAML
    (deploy / ".git" / "old.yaml").write_text(yaml.safe_dump(minimal() | {"kind": "CompiledModel", "x": 1}))
    checked = CliRunner().invoke(app, ["check", str(deploy)])
    assert checked.exit_code == 0, checked.stderr
    assert "models.yaml: valid CompiledModel 'm'" in checked.stderr, checked.stderr
    assert "1 CompiledModel in 1 file: all valid" in " ".join(checked.stderr.split()), checked.stderr

    bad = deploy / "team-b.yml"
    bad.write_text(yaml.safe_dump(minimal() | {"metadata": {"name": "Bad_Name"}}))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(minimal() | {"metadata": {"name": "m2"}}))
    checked = CliRunner().invoke(app, ["check", str(deploy), str(other)])
    said = " ".join(checked.stderr.split())
    assert checked.exit_code == 2, said
    assert "team-b.yml: invalid CompiledModel manifest" in said and "metadata.name" in said, said
    assert "other.yaml: valid CompiledModel 'm2'" in said and "models.yaml: valid" in said, said
    assert "3 files: 1 invalid" in said, said
    empty = tmp_path / "empty"
    empty.mkdir()
    checked = CliRunner().invoke(app, ["check", str(empty)])
    assert checked.exit_code == 2 and "no YAML file under" in checked.stderr, checked.stderr


def test_check_leaves_kustomize_patches_to_the_rendered_overlay(tmp_path: Path) -> None:
    """An overlay's patch is a partial CompiledModel by design (a name and the fields it changes):
    `kompile check deploy/` called each one invalid ("spec: Field required"), failing the CI of a
    correct repository. Files a kustomization names as patches are left out, with a line saying
    how to check what they make: the overlay rendered, on stdin (`kompile check -`)."""
    from typer.testing import CliRunner

    from kompile.cli import app

    deploy = tmp_path / "deploy"
    (deploy / "base").mkdir(parents=True)
    (deploy / "prod").mkdir()
    (deploy / "base" / "models.yaml").write_text(yaml.safe_dump(minimal()))
    (deploy / "base" / "kustomization.yaml").write_text("resources: [models.yaml]\n")
    partial = {"apiVersion": "kompile.dev/v1alpha1", "kind": "CompiledModel", "metadata": {"name": "m"}}
    (deploy / "prod" / "more-samples.yaml").write_text(
        yaml.safe_dump(partial | {"spec": {"validation": {"samples": 64}}})
    )
    (deploy / "prod" / "gpu.yaml").write_text(
        yaml.safe_dump(partial | {"spec": {"fleet": {"enabled": True}}})
    )
    (deploy / "prod" / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": ["../base"],
                "patchesStrategicMerge": ["more-samples.yaml"],
                "patches": [{"path": "gpu.yaml", "target": {"kind": "CompiledModel"}}],
            }
        )
    )
    checked = CliRunner().invoke(app, ["check", str(deploy)])
    said = " ".join(checked.stderr.split())
    assert checked.exit_code == 0, said
    assert "1 CompiledModel in 1 file: all valid" in said, said
    assert "2 kustomize patches" in said and "kubectl kustomize" in said and "kompile check -" in said, said

    rendered = yaml.safe_dump_all([minimal(), minimal() | {"metadata": {"name": "Bad_Name"}}])
    checked = CliRunner().invoke(app, ["check", "-"], input=rendered)
    said = " ".join(checked.stderr.split())
    assert checked.exit_code == 2, said
    assert "<stdin>, CompiledModel 'Bad_Name' (document 2)" in said and "metadata.name" in said, said
    checked = CliRunner().invoke(app, ["check", "-"], input=yaml.safe_dump(minimal()))
    assert checked.exit_code == 0 and "<stdin>: valid CompiledModel 'm'" in checked.stderr, checked.stderr


def test_what_kubectl_get_writes_runs_as_it_is(tmp_path: Path) -> None:
    """`kubectl get compiledmodel m -o yaml > m.yaml` (to try a cluster's model here) writes the
    server's metadata and the operator's status; `kubectl get compiledmodels -o yaml` a `kind:
    List` of them. `kompile` refused both: the List as "kind: 'List'", a status written by another
    operator version as unknown fields. As `kubectl apply` does, the status is not input."""
    got = minimal()
    got["metadata"] |= {
        "namespace": "team-a",
        "uid": "2f1c5a",
        "resourceVersion": "123",
        "generation": 2,
        "creationTimestamp": "2026-11-29T10:00:00Z",
        "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1"}],
    }
    got["status"] = {"observedGeneration": 2, "targets": [{"name": "t", "fieldOfALaterOperator": 1}]}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(got))
    loaded = load_manifest(path).metadata
    assert (loaded.name, loaded.namespace) == ("m", "team-a")
    # The cluster object's uid and generation are not this run's: MLflow records an operator's
    # generation once, by them, and a second `kompile run` of the file registered nothing.
    assert loaded.uid is None and loaded.generation is None
    second = {**got, "metadata": {**got["metadata"], "name": "m2"}}
    listed = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": [got, second]}
    path.write_text(yaml.safe_dump(listed))
    assert [m.metadata.name for m in load_manifests(path)] == ["m", "m2"]
    assert load_manifest(path, "m2").metadata.name == "m2"
    second["spec"] = {
        **second["spec"],
        "targets": [{"name": "t", "backend": "onnxruntime", "precision": "fp64"}],
    }
    path.write_text(yaml.safe_dump(listed))
    with pytest.raises(ManifestError, match=r"CompiledModel 'm2' \(document 1, item 2\)"):
        load_manifests(path)
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": []}))
    with pytest.raises(ManifestError, match="no CompiledModel document"):
        load_manifest(path)


def test_missing_and_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no such manifest"):
        load_manifest(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed")
    with pytest.raises(ManifestError, match="not valid YAML"):
        load_manifest(bad)
    # A model file that `kompile run` cannot read inputs from is named as such, not decoded as YAML.
    scripted = tmp_path / "model.pt"
    scripted.write_bytes(b"PK\x03\x04\xf5\x00binary zip of a TorchScript module")
    with pytest.raises(ManifestError) as info:
        load_manifest(scripted)
    message = str(info.value)
    for phrase in (
        "model.pt",
        "not a YAML manifest",
        "TorchScript",
        "spec.source.uri: model.pt",
        ".onnx or .pt2",
    ):
        assert phrase in message, message
    blob = tmp_path / "weights.bin"
    blob.write_bytes(bytes(range(256)))
    with pytest.raises(ManifestError, match=r"weights.bin: not a YAML manifest \(binary content\)"):
        load_manifest(blob)


def test_checked_in_crd_matches_models() -> None:
    path = ROOT / "crds" / CRD_FILENAME
    assert path.read_text() == render_crd(), "crds/ drifted from kompile/api: run `make crds`"


def test_reference_doc_matches_models() -> None:
    from kompile.api.reference import render_reference

    path = ROOT / "docs" / "reference.md"
    assert path.read_text() == render_reference(), "docs/reference.md drifted: run `make crds`"


def _walk(schema: dict, path: str = ""):  # type: ignore[no-untyped-def]
    yield path, schema
    for name, sub in (schema.get("properties") or {}).items():
        yield from _walk(sub, f"{path}.{name}")
    if "items" in schema:
        yield from _walk(schema["items"], f"{path}[]")


def test_crd_schema_is_structural_and_documented() -> None:
    crd = build_crd()
    version = crd["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    for part in ("spec", "status"):
        for path, node in _walk(root["properties"][part], part):
            text = yaml.safe_dump(node)
            assert "$ref" not in text and "anyOf" not in text, path
            assert "type" in node or "x-kubernetes-int-or-string" in node, f"{path} has no type"
            if not path.endswith("[]"):  # list items are described by their field
                assert node.get("description"), f"{path} has no description"
    assert crd["spec"]["names"]["shortNames"] == ["cmodel"]
    assert version["subresources"] == {"status": {}}
    targets = root["properties"]["spec"]["properties"]["targets"]
    assert targets["x-kubernetes-list-type"] == "map"
    rules = root["properties"]["spec"]["x-kubernetes-validations"]
    assert any("fleet" in r["rule"] for r in rules)


def test_condition_transition_time_moves_only_on_status_change() -> None:
    conds = set_condition([], "Ready", "False", "Progressing", "a", 1)
    first = conds[0].last_transition_time
    conds[0] = conds[0].model_copy(update={"last_transition_time": "2000-01-01T00:00:00Z"})
    same = set_condition(conds, "Ready", "False", "Progressing", "b", 2)
    assert same[0].last_transition_time == "2000-01-01T00:00:00Z"
    assert same[0].message == "b" and same[0].observed_generation == 2
    flipped = set_condition(same, "Ready", "True", "Validated", "", 2)
    assert flipped[0].last_transition_time != "2000-01-01T00:00:00Z"
    assert first


def _target(name: str, passed: bool | None, p50: float = 1.0, phase: str = "Succeeded") -> TargetStatus:
    t = TargetStatus(name=name, backend="onnxruntime", precision="fp32", phase=phase)  # type: ignore[arg-type]
    if passed is not None:
        t.validation = ValidationResult(
            passed=passed, samples=1, thresholds=Thresholds(min_cosine=0.9, top_k=5)
        )
        t.latency = [LatencyStats(batch_size=1, p50_ms=p50, p90_ms=p50, p99_ms=p50, throughput=1000 / p50)]
    return t


def test_summarize_ready_best_and_failure() -> None:
    ok = summarize(CompiledModelStatus(targets=[_target("a", True, 2.0), _target("b", True, 1.0)]), 3)
    ready = next(c for c in ok.conditions if c.type == "Ready")
    assert ready.status == "True" and ready.observed_generation == 3
    assert ok.best and ok.best.target == "b" and ok.targets_ready == "2/2"

    bad_target = _target("c", False, phase="Failed")
    bad_target.reason = "ValidationFailed"
    bad = summarize(CompiledModelStatus(targets=[_target("a", True), bad_target]), 1)
    ready = next(c for c in bad.conditions if c.type == "Ready")
    assert ready.status == "False" and ready.reason == "ValidationFailed" and "c:" in ready.message
    assert bad.targets_ready == "1/2"


@pytest.mark.parametrize("quantity", [2, "2", "500m", "4Gi", "1.5", "1e3", ".5"])
def test_a_resource_quantity_may_be_an_integer_or_a_kubernetes_quantity(quantity: int | str) -> None:
    from kompile.api.spec import Resources

    assert Resources.model_validate({"limits": {"cpu": quantity}}).to_wire() == {"limits": {"cpu": quantity}}
    quantity_schema = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    limits = quantity_schema["properties"]["targets"]["items"]["properties"]["hardware"]["properties"][
        "resources"
    ]["properties"]["limits"]["additionalProperties"]
    assert limits["x-kubernetes-int-or-string"] is True and "type" not in limits


@pytest.mark.parametrize("quantity", ["two", "-1", "4 Gi", "", -1, True])
def test_a_bad_quantity_is_refused_by_the_models(quantity: int | str) -> None:
    from pydantic import ValidationError

    from kompile.api.spec import Resources

    with pytest.raises(ValidationError):
        Resources.model_validate({"requests": {"memory": quantity}})


def test_exported_targets_neither_count_toward_ready_nor_hold_it_back() -> None:
    mac = _target("mac", None, phase="Exported")
    mac.reason, mac.message = "Exported", "not validated: no Core ML runtime on this class"
    beside = summarize(CompiledModelStatus(targets=[_target("a", True), mac]), 1)
    ready = next(c for c in beside.conditions if c.type == "Ready")
    assert ready.status == "True" and "1 exported (not validated)" in ready.message
    assert beside.targets_ready == "1/1" and beside.best and beside.best.target == "a"

    alone = summarize(CompiledModelStatus(targets=[mac]), 1)
    ready = next(c for c in alone.conditions if c.type == "Ready")
    validated = next(c for c in alone.conditions if c.type == "Validated")
    assert (ready.status, ready.reason) == ("True", "Exported") and "no Core ML runtime" in ready.message
    assert validated.status == "False" and alone.best is None


def test_a_target_stuck_while_others_compile_is_named_in_ready() -> None:
    """Ready stayed "compile in progress" while a Job's pod could not be scheduled: kubectl get (and
    Argo CD) showed nothing to act on. The waiting target's reason is in Ready's message."""
    stuck = TargetStatus(
        name="gpu",
        backend="tensorrt",
        precision="fp16",
        phase="Pending",
        reason="Unschedulable",
        message="0/3 nodes",
    )
    running = TargetStatus(name="cpu", backend="onnxruntime", precision="fp32", phase="Running")
    status = summarize(CompiledModelStatus(targets=[stuck, running]), 1)
    ready = next(c for c in status.conditions if c.type == "Ready")
    assert ready.reason == "Progressing"
    assert ready.message == "compile in progress; waiting: gpu: Unschedulable", ready.message
