"""The operator at scale on the real control plane; prints JSON.

Starts etcd, kube-apiserver, controller-manager, scheduler and kwok (devtools.devcluster), M KWOK
nodes of 5 hardware classes, and the operator as a real process under its own ServiceAccount (so the
API server's audit log can tell its requests from everyone else's). No compile runs: each compile
pod is completed by a TEST STAND-IN (tests.integration.fleet.KwokReporter) that publishes a plausible
validated result. Then N CompiledModels in fleet mode (5 targets each) are applied at once.

Reports: time from the first apply to all 5N Jobs created and to all N Ready (with --bystander,
how long one CompiledModel of another namespace, applied right after the N, waits for its first
Job and for Ready); per target, the time
from its Job's end (completionTime, whole seconds) to the status showing it settled (p50/p99); once
all are settled, the operator's API requests per CompiledModel per second over a quiet window (from
the audit log, only the operator's identity), with the API server's apiserver_request_total delta of
all clients beside it; the operator's peak RSS and CPU seconds (from /proc).

    python benchmarks/operator_scale.py --crs 100 --nodes 50 --out /tmp/scale.json

Targets (issue 13, 1,000 x 5 on 500 nodes): all Jobs created < 5 min, settled < 0.05 API
requests/CR/s, peak RSS < 500 MB, p99 Job end -> status < 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import ssl
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from cpu_artifacts import emit_json  # noqa: E402
from kubernetes import client, config  # noqa: E402

from devtools.devcluster import ControlPlane, find_bin_dir  # noqa: E402
from tests.integration.fleet import (  # noqa: E402
    KwokReporter,
    OperatorProcess,
    WatchThread,
    gpu_labels,
    kwok_node,
    small_cnn_manifest,
    succeed_and_publish,
)
from tests.integration.kwok_stages import write_stages  # noqa: E402

NS = "kompile-scale"
SA = "operator"
GROUP, VERSION, PLURAL = "kompile.dev", "v1alpha1", "compiledmodels"
TERMINAL = ("Succeeded", "Failed", "Skipped")


# The stand-in fleet's own pace: the Job controller at its defaults (20 requests/s, 5 Jobs at a
# time) needs about 25 minutes for 5,000 Jobs, as a 500-node cluster's would unless raised (as
# large clusters do). Raised here so the operator, not the stand-in, is what is measured; the
# operator's own figures (its lag behind a Job's end, its requests) do not depend on it.
FLEET_PACE = ["--kube-api-qps=100", "--kube-api-burst=200", "--concurrent-job-syncs=20"]

CLASS_LABELS = [
    gpu_labels("NVIDIA-H100-80GB-HBM3", "9", "0"),
    gpu_labels("NVIDIA-L4", "8", "9"),
    gpu_labels("NVIDIA-A10", "8", "6"),
    {"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux"},
    {"kubernetes.io/arch": "arm64", "kubernetes.io/os": "linux"},
]
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
  - level: Metadata
    users: ["system:serviceaccount:{NS}:{SA}"]
  - level: None
"""


class SettleWatch(WatchThread):
    """Records, on this machine's clock, when each (CompiledModel, target) is first seen settled."""

    def __init__(self, custom: client.CustomObjectsApi) -> None:
        self.settled: dict[tuple[str, str], datetime] = {}
        self.ready: dict[str, datetime] = {}
        super().__init__(custom.list_namespaced_custom_object, GROUP, VERSION, NS, PLURAL)

    def see(self, obj: dict[str, Any]) -> None:
        now = datetime.now(UTC)
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        for t in status.get("targets") or []:
            if t.get("phase") in TERMINAL:
                self.settled.setdefault((name, t["name"]), now)
        conds = {c["type"]: c["status"] for c in status.get("conditions") or []}
        if conds.get("Ready") == "True":
            self.ready.setdefault(name, now)


def _job_end(job: Any) -> datetime | None:
    """When the Job's outcome was known: SuccessCriteriaMet / FailureTarget come before Complete /
    Failed (and completionTime), and the operator acts on either."""
    ends: list[datetime] = [
        c.last_transition_time
        for c in job.status.conditions or []
        if c.status == "True" and c.type in ("SuccessCriteriaMet", "FailureTarget", "Complete", "Failed")
    ]
    end: datetime | None = min(ends) if ends else job.status.completion_time
    return end


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


def _proc_stats(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = {line.split(":")[0]: line.split(":")[1].strip() for line in status.splitlines() if ":" in line}
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {
        "peak_rss_mb": round(int(fields["VmHWM"].split()[0]) / 1024, 1),
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "cpu_s": round((int(stat[11]) + int(stat[12])) / ticks, 1),
    }


def _request_total(plane: ControlPlane) -> float:
    """The sum of apiserver_request_total over every label set: all clients' requests."""
    tls = ssl.create_default_context(cafile=str(plane.pki.ca_crt))
    tls.load_cert_chain(str(plane.pki.admin_crt), str(plane.pki.admin_key))
    opener = urllib.request.build_opener(
        urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=tls)
    )
    with opener.open(f"{plane.server}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("apiserver_request_total{")
    )


def _operator_requests(audit_log: Path, since: datetime, until: datetime) -> dict[str, int]:
    """The operator's requests received in [since, until), by verb and resource, from the audit log."""
    counts: dict[str, int] = {}
    seen: set[str] = set()
    for line in audit_log.read_text().splitlines():
        ev = json.loads(line)
        if ev["auditID"] in seen:
            continue
        stamp = datetime.fromisoformat(ev["requestReceivedTimestamp"].replace("Z", "+00:00"))
        if since <= stamp < until:
            seen.add(ev["auditID"])
            ref = ev.get("objectRef") or {}
            key = f"{ev['verb']} {ref.get('resource', ev.get('requestURI', ''))}"
            counts[key] = counts.get(key, 0) + 1
    return counts


def _sa_kubeconfig(plane: ControlPlane, path: Path) -> Path:
    """The operator's own identity (cluster-admin: the benchmark measures load, not RBAC)."""
    plane.kubectl("create", "serviceaccount", SA, "-n", NS)
    plane.kubectl(
        "create",
        "clusterrolebinding",
        "kompile-scale-operator",
        "--clusterrole=cluster-admin",
        f"--serviceaccount={NS}:{SA}",
    )
    token = plane.kubectl("create", "token", SA, "-n", NS, "--duration=8h").stdout.strip()
    admin = json.loads(plane.kubeconfig.read_text())
    cluster = admin["clusters"][0]["name"]
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": SA, "context": {"cluster": cluster, "user": SA}}],
        "current-context": SA,
    }
    path.write_text(json.dumps(doc))
    return path


def _wait(what: str, check: Any, timeout: float, interval: float = 1.0) -> float:
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)
    return time.monotonic() - began


NS_B = "kompile-scale-b"
"""The bystander tenant (--bystander): one CompiledModel applied right after the N of NS."""


def _bystander(custom: client.CustomObjectsApi, batch: client.BatchV1Api, timeout: float) -> dict[str, float]:
    """Apply one CompiledModel in NS_B; seconds from its apply to its first Job and to Ready. With
    namespaces taking turns in the work queue it waits for a few first looks, not for the N."""
    doc = small_cnn_manifest("bystander", NS_B, fleet={"enabled": True, "precisions": ["fp32"]})
    custom.create_namespaced_custom_object(GROUP, VERSION, NS_B, PLURAL, doc)

    def first_job() -> bool:
        return bool(batch.list_namespaced_job(NS_B, _request_timeout=60).items)

    def ready() -> bool:
        obj = custom.get_namespaced_custom_object(GROUP, VERSION, NS_B, PLURAL, "bystander")
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

    job_s = _wait("the bystander's first Job", first_job, timeout, interval=0.2)
    ready_s = _wait("the bystander Ready", ready, timeout, interval=0.2) + job_s
    return {"first_job_s": round(job_s, 1), "ready_s": round(ready_s, 1), "applied_after_s": 0.0}


def run(
    crs: int, nodes: int, quiet: float, timeout: float, work: Path, bystander: bool = False
) -> dict[str, Any]:
    bin_dir = find_bin_dir()
    policy = work / "audit-policy.yaml"
    policy.write_text(AUDIT_POLICY)
    audit_log = work / "audit.log"
    stages = write_stages(bin_dir.parent / "etc" / "kwok-stages.yaml", work / "kwok-stages.yaml")
    audit = [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}", "--audit-log-format=json"]
    plane = ControlPlane(
        bin_dir,
        work / "plane",
        controllers=True,
        kwok=True,
        kwok_config=stages,
        apiserver_args=audit,
        controller_manager_args=FLEET_PACE,
    )
    plane.start()
    reporter: KwokReporter | None = None
    reporter_b: KwokReporter | None = None
    op: OperatorProcess | None = None
    watcher: SettleWatch | None = None
    try:
        plane.apply_crds(ROOT / "crds")
        api = config.new_client_from_config(str(plane.kubeconfig))
        core, batch, custom = client.CoreV1Api(api), client.BatchV1Api(api), client.CustomObjectsApi(api)
        for i in range(nodes):
            core.create_node(kwok_node(f"scale-{i}", CLASS_LABELS[i % len(CLASS_LABELS)]))
        core.create_namespace({"metadata": {"name": NS}})
        kubeconfig = _sa_kubeconfig(plane, work / "operator.kubeconfig")
        reporter = KwokReporter(plane.kubeconfig, NS, succeed_and_publish).start()
        watching = NS
        if bystander:
            core.create_namespace({"metadata": {"name": NS_B}})
            reporter_b = KwokReporter(plane.kubeconfig, NS_B, succeed_and_publish).start()
            watching = f"{NS},{NS_B}"
        watcher = SettleWatch(custom).start()
        op = OperatorProcess(kubeconfig, watching, (work / "store").as_uri(), work / "operator.log")
        op.env["KOMPILE_RESYNC_SECONDS"] = "10"  # the default; the tests' operator runs with 2
        op.start()
        assert op.proc is not None and op.proc._proc is not None
        pid = op.proc._proc.pid

        began = time.monotonic()
        for i in range(crs):
            doc = small_cnn_manifest(f"m{i:04d}", NS, fleet={"enabled": True, "precisions": ["fp32"]})
            custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, doc)
        applied_s = time.monotonic() - began
        want = crs * len(CLASS_LABELS)
        other = _bystander(custom, batch, timeout) if bystander else None
        if other is not None:
            other["applied_after_s"] = round(applied_s, 1)

        def job_count() -> int:
            return len(batch.list_namespaced_job(NS, _request_timeout=60).items)

        _wait("all Jobs created", lambda: job_count() >= want, timeout)
        jobs_s = time.monotonic() - began
        _wait("all Ready", lambda: len(watcher.ready) >= crs, timeout)
        ready_s = time.monotonic() - began
        settle_delays: list[float] = []
        slowest: list[tuple[float, str, str, str]] = []
        for job in batch.list_namespaced_job(NS, _request_timeout=60).items:
            labels = job.metadata.labels or {}
            owner = labels.get("kompile.dev/compiledmodel", "")
            target = labels.get("kompile.dev/target", "")
            seen, ended = watcher.settled.get((owner, target)), _job_end(job)
            if ended and seen:
                settle_delays.append((seen - ended).total_seconds())
                slowest.append((settle_delays[-1], f"{owner}/{target}", ended.isoformat(), seen.isoformat()))

        time.sleep(10)  # the last events' reconciles
        since, requests_before = datetime.now(UTC), _request_total(plane)
        time.sleep(quiet)
        until, requests_after = datetime.now(UTC), _request_total(plane)
        time.sleep(2)  # the audit backend writes in batches
        by_kind = _operator_requests(audit_log, since, until)
        window = (until - since).total_seconds()
        stats = _proc_stats(pid)
        return {
            "case": {
                "crs": crs,
                "targets_per_cr": len(CLASS_LABELS),
                "nodes": nodes,
                "resync_seconds": 10,
                "controller_manager": FLEET_PACE,
            },
            "apply_s": round(applied_s, 1),
            "all_jobs_created_s": round(jobs_s, 1),
            "all_ready_s": round(ready_s, 1),
            "job_end_to_status_s": {
                "p50": _percentile(settle_delays, 0.5),
                "p99": _percentile(settle_delays, 0.99),
                "max": _percentile(settle_delays, 1.0),
                "n": len(settle_delays),
                "slowest": [
                    {"target": t, "job_end": end, "status_seen": seen, "s": round(d, 2)}
                    for d, t, end, seen in sorted(slowest, reverse=True)[:3]
                ],
                "note": "the Job's first terminal condition, in whole seconds: up to 1 s is rounding",
            },
            "settled": {
                "window_s": round(window, 1),
                "operator_requests": sum(by_kind.values()),
                "operator_requests_by_kind": by_kind,
                "operator_requests_per_cr_per_s": round(sum(by_kind.values()) / crs / window, 5),
                # The Lease renewals are the same for 1 or 10,000 CompiledModels.
                "operator_requests_per_cr_per_s_without_lease": round(
                    sum(n for k, n in by_kind.items() if not k.endswith(" leases")) / crs / window, 5
                ),
                "all_clients_requests_per_s": round((requests_after - requests_before) / window, 2),
            },
            "operator": stats,
            **({"bystander": other} if other is not None else {}),
        }
    finally:
        if watcher is not None:
            watcher.stop()
        if op is not None:
            op.stop()
        for r in (reporter, reporter_b):
            if r is not None:
                r.stop()
        plane.stop()


def _machine() -> dict[str, Any]:
    info = Path("/proc/cpuinfo").read_text()
    model = next(
        (line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), ""
    )
    flags = next(
        (line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []
    )
    isa = sorted(f for f in flags if f == "avx2" or f.startswith("avx512"))
    # Other work on the machine slows every figure here: say how busy it was.
    return {
        "cpu": model or platform.machine(),
        "isa": isa,
        "cores": os.cpu_count(),
        "loadavg": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--crs", type=int, default=100, help="CompiledModels (5 targets each)")
    p.add_argument("--nodes", type=int, default=50, help="KWOK nodes, spread over 5 hardware classes")
    p.add_argument("--quiet-seconds", type=float, default=60.0, help="settled window for API requests")
    p.add_argument("--timeout", type=float, default=1800.0, help="for each phase")
    p.add_argument("--work-dir", type=Path, default=None, help="keep logs here (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--bystander",
        action="store_true",
        help=f"one more CompiledModel in {NS_B}, applied right after the N: how long it waits",
    )
    args = p.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kompile-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    doc = run(args.crs, args.nodes, args.quiet_seconds, args.timeout, work, args.bystander)
    doc["machine"] = _machine()
    doc["command"] = " ".join(["python", "benchmarks/operator_scale.py", *(argv or sys.argv[1:])])
    emit_json(doc, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
