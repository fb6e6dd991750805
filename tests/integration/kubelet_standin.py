"""KubeletStandIn: a TEST STAND-IN for the kubelet of one node (no container runtime runs here).

It registers a Node, keeps its Ready heartbeat fresh, and runs each pod the real scheduler binds to
it as a local process: the container's command with the container's env (envFrom Secrets resolved),
an emptyDir stand-in as /scratch (PyTorch Inductor's kernel cache shared by the node's pods, to save the
suite cold compiles), the termination message read back from the file the command
writes (FallbackToLogsOnError honoured), and the container's memory limit held as a cgroup holds it
(the process tree killed past it, reported OOMKilled). Pod status goes through the real API server,
so the real Job controller sees the outcome. Everything above the container runtime is real.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from kubernetes.utils import parse_quantity

HEARTBEAT_SECONDS = 10
MESSAGE_LIMIT = 4096


def _hold_to_memory_limit(proc: subprocess.Popen[bytes], limit: str | None) -> bool:
    """Wait for the container's process; kill its whole tree once the tree's resident memory passes
    the container's memory limit, and say so: the STAND-IN for the cgroup's OOM killer (a real
    kubelet reports that kill as exit code 137, reason OOMKilled)."""
    cap = int(parse_quantity(limit)) if limit else None
    while proc.poll() is None:
        if cap is not None:
            try:
                tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
                used = sum(p.memory_info().rss for p in tree)
            except psutil.Error:  # it ended meanwhile
                continue
            if used > cap:
                for p in reversed(tree):
                    with contextlib.suppress(psutil.Error):
                        p.kill()
                proc.wait()
                return True
        time.sleep(0.1)
    return False


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeletStandIn:
    def __init__(
        self,
        kubeconfig: Path,
        node_name: str,
        labels: dict[str, str],
        work_dir: Path,
        source_dir: Path,
        cpu: str = "2",
        memory: str = "16Gi",
    ) -> None:
        self.node_name = node_name
        self.labels = labels
        self.work_dir = work_dir
        self.source_dir = source_dir
        self.capacity = {"cpu": cpu, "memory": memory, "pods": "20", "ephemeral-storage": "100Gi"}
        api = config.new_client_from_config(str(kubeconfig))
        self.core = client.CoreV1Api(api)
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._started: set[str] = set()
        self._running: set[str] = set()
        self._deleted: set[str] = set()
        self._lock = threading.Lock()
        self.ran: list[str] = []
        """Names of pods run, in order (tests assert on it)."""

    # -- node ------------------------------------------------------------------------------------

    def start(self) -> KubeletStandIn:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": self.node_name,
                "labels": {**self.labels, "kubernetes.io/hostname": self.node_name},
            },
        }
        try:
            self.core.create_node(body)
        except ApiException as err:
            if err.status != 409:
                raise
        self._heartbeat()
        for target in (self._heartbeat_loop, self._watch_pods):
            t = threading.Thread(target=target, daemon=True, name=f"kubelet-standin-{target.__name__}")
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=15)

    def _heartbeat(self) -> None:
        now = _now()
        status = {
            "status": {
                "capacity": self.capacity,
                "allocatable": self.capacity,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet stand-in is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "operatingSystem": "linux",
                    "kubeletVersion": "standin",
                    "containerRuntimeVersion": "standin://local-process",
                    "kernelVersion": "",
                    "osImage": "",
                    "kubeProxyVersion": "",
                    "machineID": "",
                    "systemUUID": "",
                    "bootID": "",
                },
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            }
        }
        self.core.patch_node_status(self.node_name, status)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._heartbeat()
            except ApiException:
                continue  # a missed beat is what a real kubelet would suffer too

    # -- pods ------------------------------------------------------------------------------------

    def _watch_pods(self) -> None:
        selector = f"spec.nodeName={self.node_name}"
        while not self._stop.is_set():
            w = watch.Watch()
            try:
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces, field_selector=selector, timeout_seconds=5
                ):
                    pod = ev["object"]
                    key = f"{pod.metadata.namespace}/{pod.metadata.name}"
                    # Only pods with a command can run as a local process (compile Jobs); others
                    # (an image's entrypoint, the chart's operator) stay Pending, as with no image.
                    runnable = bool(pod.spec.containers and pod.spec.containers[0].command)
                    if ev["type"] == "DELETED":
                        self._tear_down(key)
                    elif pod.status.phase == "Pending" and runnable and key not in self._started:
                        self._started.add(key)
                        threading.Thread(target=self._run_pod, args=(pod,), daemon=True).start()
                    if self._stop.is_set():
                        break
            except ApiException:
                time.sleep(1)
            finally:
                w.stop()

    def _tear_down(self, key: str) -> None:
        """As a kubelet tears down a deleted pod's emptyDir, freeing the node's disk: at once, or when
        the pod's process ends (this stand-in does not stop a running process)."""
        with self._lock:
            self._deleted.add(key)
            if key in self._running:
                return
        shutil.rmtree(self.work_dir / key, ignore_errors=True)

    def _env(self, namespace: str, container: Any, scratch: Path) -> dict[str, str]:
        env = {
            "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
            # The test run's PyTorch Inductor kernel cache (tests/conftest.py), shared by the stand-in's
            # pods as by the pipeline tests: a real pod compiles in its own emptyDir, cold (about 20 s
            # more for the small CNN's AOTInductor candidate on 2 cores), which no test here is about.
            # A pod's own env wins.
            "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR")
            or str(self.work_dir / "inductor-cache"),
        }
        for src in container.env_from or []:
            if src.secret_ref is not None:
                secret = self.core.read_namespaced_secret(src.secret_ref.name, namespace)
                env |= {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}
        env |= {e.name: e.value or "" for e in container.env or []}
        # The pod's /scratch emptyDir, its termination log, and the image's model code.
        env |= {
            "KOMPILE_WORK_DIR": str(scratch),
            "HOME": str(scratch),
            "TMPDIR": str(scratch),
            "KOMPILE_TERMINATION_LOG": str(scratch / "termination-log"),
            "KOMPILE_SOURCE_DIR": str(self.source_dir),
        }
        return env

    def _run_pod(self, pod: Any) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        key = f"{ns}/{name}"
        with self._lock:
            self._running.add(key)
        try:
            self._run_container(pod)
        finally:
            with self._lock:
                self._running.discard(key)
                deleted = key in self._deleted
            if deleted:
                shutil.rmtree(self.work_dir / key, ignore_errors=True)

    def _run_container(self, pod: Any) -> None:
        ns, name = pod.metadata.namespace, pod.metadata.name
        container = pod.spec.containers[0]
        scratch = self.work_dir / ns / name
        scratch.mkdir(parents=True, exist_ok=True)
        started = _now()
        self._patch(ns, name, "Running", container, {"running": {"startedAt": started}}, ready=True)
        self.ran.append(name)
        command = [*(container.command or []), *(container.args or [])]
        exe = shutil.which(command[0], path=self._env(ns, container, scratch)["PATH"]) or command[0]
        log_path = scratch / "container.log"
        limits = (container.resources.limits if container.resources else None) or {}
        with log_path.open("w") as log:
            proc = subprocess.Popen(
                [exe, *command[1:]],
                env=self._env(ns, container, scratch),
                cwd=scratch,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            oom_killed = _hold_to_memory_limit(proc, limits.get("memory"))
        term_file = scratch / "termination-log"
        message = term_file.read_text() if term_file.exists() else ""
        if (
            not message
            and proc.returncode != 0
            and container.termination_message_policy == "FallbackToLogsOnError"
        ):
            message = log_path.read_text()[-MESSAGE_LIMIT:]
        terminated = {
            "exitCode": 137 if oom_killed else proc.returncode,
            "reason": "OOMKilled" if oom_killed else "Completed" if proc.returncode == 0 else "Error",
            "message": message[-MESSAGE_LIMIT:],
            "startedAt": started,
            "finishedAt": _now(),
        }
        phase = "Succeeded" if proc.returncode == 0 and not oom_killed else "Failed"
        self._patch(ns, name, phase, container, {"terminated": terminated}, ready=False)

    def _patch(
        self, ns: str, name: str, phase: str, container: Any, state: dict[str, Any], ready: bool
    ) -> None:
        now = _now()
        body = {
            "status": {
                "phase": phase,
                "hostIP": "127.0.0.1",
                "podIP": "127.0.0.1",
                "startTime": now,
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now}
                ],
                "containerStatuses": [
                    {
                        "name": container.name,
                        "image": container.image,
                        "imageID": "",
                        "ready": ready,
                        "restartCount": 0,
                        "started": ready,
                        "state": state,
                    }
                ],
            }
        }
        try:
            self.core.patch_namespaced_pod_status(name, ns, body)
        except ApiException as err:
            if err.status != 404:  # the pod may be gone (Job deleted): nothing to report to
                raise
