"""The Helm chart with the real helm binary, applied to the real control plane. The operator then runs
as a process under the chart's ServiceAccount token (not the admin certificate), so a verb the chart
forgot shows up as a 403 here, and `kubectl auth can-i` shows what the chart must never grant. A rollout
under that token, with real MLflow and S3 servers and KServe's real CRD (its controller stood in), covers
the Secret, KServe and ConfigMap rules."""

from __future__ import annotations

import base64
import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster import ControlPlane, find_bin_dir
from tests.integration.fleet import (
    LOCAL_NODE,
    OperatorProcess,
    refused_calls,
    small_cnn_manifest,
    token_kubeconfig,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn
from tests.support.kserve import KServeControllerStandIn, install_crd
from tests.support.servers import MlflowServer, S3Server

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "kompile"
# The release name holds the chart name, so the objects are called "kompile-rbac". Not "kompile": the
# tutorial's test installs that release with helm on the same control plane.
RELEASE = "kompile-rbac"
SYSTEM_NS = "kompile-system"  # where the operator's ServiceAccount lives
WATCH_NS = "kompile-rbac"  # the one namespace the operator is given
SA_USER = f"system:serviceaccount:{SYSTEM_NS}:{RELEASE}"
STORE_SECRET = "store-creds"
S3_SECRET = "s3-creds"  # named by a CompiledModel's spec.registry.credentialsSecret
BUCKET = "kompile-rbac"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
NAMESPACED_VALUES: dict[str, Any] = {
    "watchNamespaces": [WATCH_NS],
    "artifactStore": {
        "uri": "file:///var/lib/kompile/artifacts",
        "credentialsSecret": STORE_SECRET,
        "credentialsSecrets": [S3_SECRET],
    },
    # No container runtime runs the operator's own pod here (the test runs it as a process under the
    # same identity): a selector no node has keeps the pod Pending, off the kubelet stand-in.
    "nodeSelector": {"kompile.dev/test-no-such-node": "true"},
}


def helm(*args: str, values: dict[str, Any] | None = None) -> str:
    """Run the real helm; values go in as a file on stdin (JSON is YAML)."""
    cmd = [str(find_bin_dir() / "helm"), *args, *(["-f", "-"] if values is not None else [])]
    result = subprocess.run(cmd, input=json.dumps(values or {}), capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{' '.join(cmd)} failed:\n{result.stderr}"
    return result.stdout


def render(values: dict[str, Any], *extra: str) -> list[dict[str, Any]]:
    out = helm("template", RELEASE, str(CHART), "-n", SYSTEM_NS, *extra, values=values)
    return [d for d in yaml.safe_load_all(out) if d]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def all_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in docs if d["kind"] in ("Role", "ClusterRole") for r in d["rules"]]


# -- without a cluster -------------------------------------------------------------------------------


def test_lint_strict() -> None:
    helm("lint", "--strict", str(CHART), values=NAMESPACED_VALUES)
    helm("lint", "--strict", str(CHART))


def test_schema_rejects_bad_values() -> None:
    cmd = [str(find_bin_dir() / "helm"), "template", str(CHART), "--set", "watchNamespaces[0]=Not_A_Name"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "watchNamespaces" in result.stderr, result.stderr


def test_deployment_is_hardened_and_configured() -> None:
    (dep,) = of_kind(render(NAMESPACED_VALUES), "Deployment")
    spec = dep["spec"]
    # Standbys wait on the Lease, so replicas may be more than one and updates may roll.
    assert spec["replicas"] == 1 and "strategy" not in spec
    (scaled,) = of_kind(render({**NAMESPACED_VALUES, "replicas": 2}), "Deployment")
    assert scaled["spec"]["replicas"] == 2
    pod = spec["template"]["spec"]
    (c,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/tmp"}
    for probe in (c["livenessProbe"], c["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["KOMPILE_NAMESPACES"] == WATCH_NS and env["KOMPILE_STORE_SECRET"] == STORE_SECRET
    assert env["KOMPILE_HEALTH_PORT"] == "8080" and env["KOMPILE_METRICS_PORT"] == "9090"
    assert c["resources"]["limits"]["memory"]
    assert env["KOMPILE_LEASE_NAME"] == RELEASE
    refs = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"] if "valueFrom" in e}
    assert refs == {"POD_NAMESPACE": "metadata.namespace", "POD_NAME": "metadata.name"}


def test_the_environment_images_reach_the_operator_only_when_set() -> None:
    def env_of(values: dict[str, Any]) -> dict[str, Any]:
        (dep,) = of_kind(render(values), "Deployment")
        return {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]}

    assert not {"KOMPILE_ENVS_IMAGE", "KOMPILE_GPU_ENVS_IMAGE"} & set(env_of(NAMESPACED_VALUES))
    images = {"cpu": "c:1", "gpu": "g:1", "allEnvironments": "all:1", "gpuEnvironments": "gpu-envs:1"}
    env = env_of({**NAMESPACED_VALUES, "compileImages": images})
    assert env["KOMPILE_ENVS_IMAGE"] == "all:1" and env["KOMPILE_GPU_ENVS_IMAGE"] == "gpu-envs:1"


def test_namespaced_mode_grants_nothing_namespaced_cluster_wide() -> None:
    docs = render(NAMESPACED_VALUES)
    roles = of_kind(docs, "Role")
    assert {(r["metadata"]["namespace"], r["metadata"]["name"]) for r in roles} == {
        (WATCH_NS, RELEASE),
        ("kserve", f"{RELEASE}-kserve-config"),
        (SYSTEM_NS, f"{RELEASE}-leader"),
    }
    (cluster,) = of_kind(docs, "ClusterRole")  # cluster-scoped reads only
    assert {(g, res) for r in cluster["rules"] for g in r["apiGroups"] for res in r["resources"]} == {
        ("", "nodes"),
        ("", "namespaces"),  # Kopf's namespace and resource observer
        ("apiextensions.k8s.io", "customresourcedefinitions"),
    }
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in cluster["rules"])


def test_cluster_wide_mode_uses_one_cluster_role() -> None:
    docs = render({"artifactStore": {"uri": "s3://bucket"}})
    assert not [r for r in of_kind(docs, "Role") if r["metadata"]["name"] == RELEASE]
    names = {r["metadata"]["name"] for r in of_kind(docs, "ClusterRole")}
    assert names == {f"{RELEASE}-namespaced", f"{RELEASE}-cluster"}
    bindings = {b["roleRef"]["name"] for b in of_kind(docs, "ClusterRoleBinding")}
    assert bindings == names


@pytest.mark.parametrize("values", [NAMESPACED_VALUES, {"artifactStore": {"uri": "s3://b"}}])
def test_rules_never_grant_the_dangerous_verbs(values: dict[str, Any]) -> None:
    rules = all_rules(render(values))
    for rule in rules:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert not set(rule["apiGroups"]) & {"rbac.authorization.k8s.io", "*"}, rule
        if "pods" in rule["resources"]:
            assert rule["verbs"] == ["list"], rule
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["get"] and rule["resourceNames"], rule
    # Without a credentials Secret in the values, no Secret at all.
    assert not any("secrets" in r["resources"] for r in all_rules(render({})))


def test_crds_and_health_check_have_one_source() -> None:
    # Symlinks: helm follows them when it loads a chart folder and `helm package` copies the content.
    assert (CHART / "crds").resolve() == (ROOT / "crds").resolve()
    health = (ROOT / "gitops" / "argocd" / "health.lua").read_text()
    assert (CHART / "files" / "argocd-health.lua").read_text() == health
    docs = render({"argocd": {"healthCheckConfigMap": True}}, "--include-crds")
    (crd,) = of_kind(docs, "CustomResourceDefinition")
    (repo_crd,) = [
        d for f in sorted((ROOT / "crds").glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
    ]
    assert crd == repo_crd
    (cm,) = of_kind(docs, "ConfigMap")
    assert cm["data"]["resource.customizations.health.kompile.dev_CompiledModel"].strip() == health.strip()


def test_service_monitor_option() -> None:
    assert not of_kind(render({}), "ServiceMonitor")
    (sm,) = of_kind(render({"serviceMonitor": {"enabled": True}}), "ServiceMonitor")
    (svc,) = of_kind(render({}), "Service")
    assert sm["spec"]["endpoints"][0]["port"] == "metrics" == svc["spec"]["ports"][0]["name"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()


# -- on the control plane ----------------------------------------------------------------------------


def ensure_namespace(plane: ControlPlane, name: str) -> None:
    # Namespaces outlive this module (one control plane per session): create only when absent.
    if plane.kubectl("get", "namespace", name, check=False).returncode != 0:
        plane.kubectl("create", "namespace", name)


def sa_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """A kubeconfig holding a token of the chart's ServiceAccount: the credentials its pod would get."""
    return token_kubeconfig(plane, SYSTEM_NS, RELEASE, path)


@pytest.fixture(scope="module")
def installed(
    control_plane: ControlPlane, sim_fleet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """The chart applied (CRDs are already installed by the session), then the operator as a process
    with the ServiceAccount's token."""
    work = tmp_path_factory.mktemp("helm")
    for ns in (SYSTEM_NS, WATCH_NS, "kserve"):
        ensure_namespace(control_plane, ns)
    manifests = helm("template", RELEASE, str(CHART), "-n", SYSTEM_NS, values=NAMESPACED_VALUES)
    control_plane.kubectl("apply", "--server-side", "-f", "-", input=manifests)
    kubeconfig = sa_kubeconfig(control_plane, work / "operator.kubeconfig")
    # The Secret the chart grants: the operator reads it (store credentials) with its own token.
    # Dummy keys: the file:// store below ignores them.
    if control_plane.kubectl("get", "secret", STORE_SECRET, "-n", WATCH_NS, check=False).returncode:
        literals = ["--from-literal=AWS_ACCESS_KEY_ID=test", "--from-literal=AWS_SECRET_ACCESS_KEY=test"]
        control_plane.kubectl("create", "secret", "generic", STORE_SECRET, "-n", WATCH_NS, *literals)
    store = (work / "store").as_uri()
    # Outside a pod: the Lease namespace is the release's, as the pod would read it.
    env = {
        "KOMPILE_STORE_SECRET": STORE_SECRET,
        "KOMPILE_LEASE_NAME": RELEASE,
        "KOMPILE_LEASE_NAMESPACE": SYSTEM_NS,
    }
    op = OperatorProcess(kubeconfig, WATCH_NS, store, work / "operator.log", extra_env=env).start()
    try:
        yield {"plane": control_plane, "kubeconfig": kubeconfig, "log": work / "operator.log", "store": store}
    finally:
        op.stop()
        print(f"\noperator log: {work / 'operator.log'}")


def can_i(plane: ControlPlane, verb: str, resource: str, namespace: str | None) -> bool:
    where = ["-n", namespace] if namespace else []
    result = plane.kubectl("auth", "can-i", verb, resource, *where, f"--as={SA_USER}", check=False)
    return result.stdout.strip() == "yes"


def test_chart_objects_exist(installed: dict[str, Any]) -> None:
    plane = installed["plane"]
    plane.kubectl("get", "deployment", RELEASE, "-n", SYSTEM_NS)
    plane.kubectl("get", "role", RELEASE, "-n", WATCH_NS)
    assert plane.kubectl("get", "role", RELEASE, "-n", SYSTEM_NS, check=False).returncode != 0


def compiled_model(name: str) -> dict[str, Any]:
    """One explicit target that only the kubelet stand-in's node matches, so the compile really runs."""
    target = {
        "name": "avx2-ort",
        "backend": "onnxruntime",
        "precision": "fp32",
        "hardware": {"nodeSelector": {"feature.node.kubernetes.io/cpu-cpuid.AVX2": "true"}},
    }
    return small_cnn_manifest(name, WATCH_NS, targets=[target])


def test_operator_with_chart_credentials_reaches_ready(installed: dict[str, Any]) -> None:
    plane = installed["plane"]
    plane.kubectl("apply", "-f", "-", input=json.dumps(compiled_model("rbac-small")))

    def ready() -> dict[str, Any] | None:
        out = plane.kubectl("get", "cmodel", "rbac-small", "-n", WATCH_NS, "-o", "json").stdout
        obj: dict[str, Any] = json.loads(out)
        status = obj.get("status") or {}
        conds = {c["type"]: c["status"] for c in status.get("conditions", [])}
        targets = status.get("targets") or []
        settled = targets and all(t["phase"] in ("Succeeded", "Failed", "Skipped") for t in targets)
        return obj if settled and conds.get("Ready") in ("True", "False") else None

    obj = wait_for("Ready under the chart's ServiceAccount", ready, timeout=120)
    status = obj["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True", status
    (target,) = status["targets"]
    assert target["node"] == LOCAL_NODE and target["validation"]["passed"], target
    events = plane.kubectl("get", "events", "-n", WATCH_NS, "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"]}
    assert "StoreRefused" not in reasons, reasons  # the granted Secret was readable
    log = installed["log"].read_text()
    # Every call the operator made was allowed: a missing rule would be a 403 in its log.
    assert not refused_calls(log), log[-3000:]


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        # What it needs.
        ("create", "jobs.batch", WATCH_NS, True),
        ("delete", "jobs.batch", WATCH_NS, True),
        ("list", "pods", WATCH_NS, True),
        ("patch", "compiledmodels.kompile.dev/status", WATCH_NS, True),
        ("list", "nodes", None, True),
        ("watch", "nodes", None, True),  # the fleet index
        ("get", f"leases.coordination.k8s.io/{RELEASE}", SYSTEM_NS, True),
        ("update", f"leases.coordination.k8s.io/{RELEASE}", SYSTEM_NS, True),
        ("create", "leases.coordination.k8s.io", SYSTEM_NS, True),
        ("watch", "namespaces", None, True),
        ("get", "configmaps/inferenceservice-config", "kserve", True),
        ("get", f"secrets/{STORE_SECRET}", WATCH_NS, True),
        ("get", f"secrets/{S3_SECRET}", WATCH_NS, True),
        (
            "get",
            "customresourcedefinitions.apiextensions.k8s.io/inferenceservices.serving.kserve.io",
            None,
            True,
        ),
        # Secrets it was not given: none listed, none by other names, none elsewhere.
        ("list", "secrets", WATCH_NS, False),
        ("get", "secrets/other", WATCH_NS, False),
        ("get", f"secrets/{STORE_SECRET}", "kube-system", False),
        ("get", "secrets", "kube-system", False),
        # Pods are the Job controller's to make; Jobs only where it was given a namespace.
        ("create", "pods", WATCH_NS, False),
        ("create", "pods", "default", False),
        ("create", "jobs.batch", "default", False),
        ("create", "jobs.batch", SYSTEM_NS, False),
        ("list", "compiledmodels.kompile.dev", "default", False),
        # RBAC itself, anywhere.
        ("create", "roles.rbac.authorization.k8s.io", WATCH_NS, False),
        ("patch", "roles.rbac.authorization.k8s.io", WATCH_NS, False),
        ("create", "rolebindings.rbac.authorization.k8s.io", WATCH_NS, False),
        ("patch", "rolebindings.rbac.authorization.k8s.io", SYSTEM_NS, False),
        ("create", "clusterroles.rbac.authorization.k8s.io", None, False),
        ("patch", "clusterroles.rbac.authorization.k8s.io", None, False),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", None, False),
        ("escalate", "roles.rbac.authorization.k8s.io", WATCH_NS, False),
        ("bind", "clusterroles.rbac.authorization.k8s.io", None, False),
        # Cluster-scoped objects are read, never changed; other ConfigMaps are not read.
        ("patch", "nodes", None, False),
        ("update", "leases.coordination.k8s.io/other", SYSTEM_NS, False),
        ("create", "leases.coordination.k8s.io", WATCH_NS, False),
        ("delete", f"leases.coordination.k8s.io/{RELEASE}", SYSTEM_NS, False),
        ("delete", "namespaces", None, False),
        ("patch", "customresourcedefinitions.apiextensions.k8s.io", None, False),
        ("list", "configmaps", "kserve", False),
        ("get", "configmaps/other", "kserve", False),
    ],
)
def test_service_account_can_only_what_it_needs(
    installed: dict[str, Any], verb: str, resource: str, namespace: str | None, allowed: bool
) -> None:
    assert can_i(installed["plane"], verb, resource, namespace) is allowed


# -- a rollout under the chart's token ---------------------------------------------------------------


@pytest.fixture(scope="module")
def serving(
    installed: dict[str, Any], s3_server: S3Server, mlflow_server: MlflowServer
) -> Iterator[KServeControllerStandIn]:
    """Real S3 and MLflow servers, KServe's real CRD and a cluster config that asks for Standard mode,
    and the TEST STAND-IN for KServe's controller writing InferenceService status."""
    plane: ControlPlane = installed["plane"]
    s3_server.create_bucket(BUCKET)
    keys = {"AWS_ACCESS_KEY_ID": s3_server.access_key, "AWS_SECRET_ACCESS_KEY": s3_server.secret_key}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": S3_SECRET, "namespace": WATCH_NS},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(secret))  # on stdin: no key in a process list
    install_crd(plane)
    # The operator must read this to pick the canary style: unread (a 403 reads as "absent"), it
    # would assume Serverless and canary through canaryTrafficPercent instead of spec.canary.
    kserve_config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "inferenceservice-config", "namespace": "kserve"},
        "data": {"deploy": json.dumps({"defaultDeploymentMode": "RawDeployment"})},
    }
    plane.kubectl("apply", "-f", "-", input=json.dumps(kserve_config))
    standin = KServeControllerStandIn(plane.kubeconfig, WATCH_NS).start()
    try:
        yield standin
    finally:
        standin.stop()
        # Other tests' operators read the same cluster config: leave KServe's default again.
        plane.kubectl("delete", "configmap", "inferenceservice-config", "-n", "kserve", "--ignore-not-found")
        assert not standin.errors, standin.errors


def _rolled_out(plane: ControlPlane, name: str, generation: int) -> dict[str, Any] | None:
    out = plane.kubectl("get", "cmodel", name, "-n", WATCH_NS, "-o", "json").stdout
    obj: dict[str, Any] = json.loads(out)
    status = obj.get("status") or {}
    rollouts = status.get("rollouts") or []
    settled = rollouts and rollouts[0]["phase"] in ("Ready", "Failed", "Blocked", "RolledBack")
    return obj if status.get("observedGeneration") == generation and settled else None


def _isvc(plane: ControlPlane, name: str) -> dict[str, Any]:
    out = plane.kubectl("get", "inferenceservices.serving.kserve.io", name, "-n", WATCH_NS, "-o", "json")
    obj: dict[str, Any] = json.loads(out.stdout)
    return obj


def test_rollout_with_chart_credentials(
    installed: dict[str, Any],
    serving: KServeControllerStandIn,
    s3_server: S3Server,
    mlflow_server: MlflowServer,
) -> None:
    """Create, canary (spec.canary, Standard mode) and promote an InferenceService, artifacts in S3
    through the granted Secret, versions and aliases in MLflow: all under the ServiceAccount's token."""
    from mlflow import MlflowClient

    plane: ControlPlane = installed["plane"]
    name, model = "rbac-serve", "rbac-serve-model"
    doc = compiled_model(name)
    doc["spec"]["registry"] = {
        "trackingUri": mlflow_server.tracking_uri,
        "artifactStore": f"s3://{BUCKET}/store",
        "s3Endpoint": s3_server.endpoint,
        "credentialsSecret": {"name": S3_SECRET},
        "modelName": model,
    }
    # No deploymentMode: read from KServe's ConfigMap (RawDeployment), so the canary is spec.canary.
    doc["spec"]["rollout"] = {"enabled": True, "canaryTrafficPercent": 20, "canaryTimeoutSeconds": 120}
    plane.kubectl("apply", "-f", "-", input=json.dumps(doc))
    mlflow = MlflowClient(tracking_uri=mlflow_server.tracking_uri)

    obj = wait_for("first rollout", lambda: _rolled_out(plane, name, 1), timeout=300)
    (rollout,) = obj["status"]["rollouts"]
    assert rollout["phase"] == "Ready", rollout
    assert rollout["deploymentMode"] in ("RawDeployment", "Standard"), rollout  # the ConfigMap was read
    (target,) = obj["status"]["targets"]
    first_uri = target["artifact"]["uri"]
    assert first_uri.startswith(f"s3://{BUCKET}/store/cache/"), target  # via the granted Secret
    assert _isvc(plane, name)["spec"]["predictor"]["model"]["storageUri"] == first_uri
    assert mlflow.get_registered_model(model).aliases == {"cpu-amd64-avx2": target["registeredVersion"]}

    # A new generation: a canary next to the serving model (a patch), then promoted (a patch).
    patch = json.dumps({"spec": {"validation": {"samples": 3}}})
    plane.kubectl("patch", "cmodel", name, "-n", WATCH_NS, "--type=merge", "-p", patch)
    obj = wait_for("promoted", lambda: _rolled_out(plane, name, 2), timeout=300)
    (rollout,) = obj["status"]["rollouts"]
    (target,) = obj["status"]["targets"]
    assert rollout["phase"] == "Ready" and target["artifact"]["uri"] != first_uri, obj["status"]
    # KServe's CRD was read (it has spec.canary): the canary ran as its own predictor Deployment.
    assert any(re.search(r"-c[0-9a-f]{8}-predictor$", d) for d in serving.created), serving.created
    isvc = _isvc(plane, name)
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == target["artifact"]["uri"]
    assert not isvc["spec"].get("canary"), isvc["spec"]
    assert mlflow.get_registered_model(model).aliases == {"cpu-amd64-avx2": target["registeredVersion"]}

    events = plane.kubectl("get", "events", "-n", WATCH_NS, "-o", "json").stdout
    reasons = {e["reason"] for e in json.loads(events)["items"] if e["involvedObject"]["name"] == name}
    assert {"RolloutCreate", "RolloutUpdate", "RolloutPromote", "AliasMoved"} <= reasons, reasons
    assert not reasons & {"StoreRefused", "RolloutFailed", "RegistryFailed"}, reasons
    log = installed["log"].read_text()
    assert not refused_calls(log), log[-3000:]
    # Asked now that KServe's CRD exists (kubectl cannot resolve the resource before): what it did
    # above, and no more; an InferenceService goes with its CompiledModel through its ownerReference.
    for verb, namespace, allowed in [
        ("get", WATCH_NS, True),
        ("create", WATCH_NS, True),
        ("patch", WATCH_NS, True),
        ("delete", WATCH_NS, False),
        ("update", WATCH_NS, False),
        ("create", "default", False),
    ]:
        assert can_i(plane, verb, "inferenceservices.serving.kserve.io", namespace) is allowed, verb
