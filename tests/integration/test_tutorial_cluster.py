"""Sections 2-4 of docs/tutorial.md: every command of their ```bash blocks runs as written, in order, in
bash, and must succeed; then the test checks what it did (the example Ready, one Job per target, the
chart's operator Ready from the cache, the RBAC answers, a clean uninstall).

The commands run as in a user's terminal: a folder that looks like the repository, the environment
their `export` lines build (kubectl and helm from scripts/build-control-plane.sh on PATH), commands
marked `# keeps running` in the background (another terminal) until a `# Ctrl-C ...` line says to
stop them. What cannot run here is stood in for at the edge only, each named so below:
- KUBECONFIG: the `export` line pastes what `make dev-cluster` printed; the test pastes the session's
  control plane (the same ControlPlane, plus the simulated fleet). `make dev-cluster` itself runs
  in its own test.
- scripts/setup-venv.sh: prints the running venv (SETUP_VENV_STANDIN) instead of re-installing this
  checkout into the shared venv.
- `kompile`: a shim that runs this checkout's CLI with the test's Python (KOMPILE_SHIM).
- compile pods: on KWOK nodes they report what the test decides (KwokReporter); on the kubelet
  stand-in's node they run for real as local processes (sim_fleet).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.devcluster import ControlPlane, find_bin_dir
from devtools.processes import free_port, probe
from tests.integration.fleet import (
    CLASSES,
    LOCAL_NODE,
    KwokReporter,
    publish_entry,
    refused_calls,
    success_result,
    wait_for,
)
from tests.integration.kubelet_standin import KubeletStandIn

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
NS = "ml"  # the tutorial's namespace
RELEASE, SYSTEM_NS = "kompile", "kompile-system"
LOCAL_CLASS = "cpu-amd64-avx2"  # the kubelet stand-in's class: its targets compile for real
EXAMPLE = "small-cnn"  # the CompiledModel the tutorial applies (examples/small-cnn.yaml)
BACKGROUND = "keeps running"  # a command's comment that says it stays in the foreground of its terminal
STOP = "Ctrl-C"  # a comment line that says to stop what keeps running
WAIT_TIMEOUT = 660.0  # a command with its own --timeout (the tutorial's longest is 10m)
COMMAND_TIMEOUT = 180.0

SETUP_VENV_STANDIN = f"""#!/bin/sh
# TEST STAND-IN for scripts/setup-venv.sh: the venv exists (the one running the tests); the real
# script would also `pip install -e .` this checkout into that shared venv.
echo {Path(sys.executable).parent.parent}
"""
KOMPILE_SHIM = f"""#!/bin/sh
# TEST STAND-IN for the venv's `kompile` console script, which may point at another checkout:
# this checkout's CLI (PYTHONPATH) with the test's Python.
exec {sys.executable} -m kompile.cli "$@"
"""


# -- the tutorial, parsed --------------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    text: str  # continuation lines joined; empty for a comment line
    comment: str  # the trailing `# ...` (or the comment line), without the hash

    @property
    def background(self) -> bool:
        return bool(self.text) and BACKGROUND in self.comment

    @property
    def stop(self) -> bool:
        return not self.text and STOP in self.comment


def section(number: int) -> str:
    text = TUTORIAL.read_text()
    return text.split(f"\n## {number}.", 1)[1].split("\n## ", 1)[0]


def blocks(number: int, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(number), flags=re.S)


def commands(number: int) -> list[Command]:
    out: list[Command] = []
    for block in blocks(number, "bash"):
        joined = re.sub(r"\\\n\s*", "", block)  # a trailing backslash continues the line
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("#") and STOP in line:
                out.append(Command("", line.lstrip("# ")))
            if not line or line.startswith("#"):
                continue
            match = re.match(r"^(.*?)\s+#\s(.*)$", line)
            text, comment = (match.group(1), match.group(2).strip()) if match else (line, "")
            out.append(Command(text, comment))
    return out


# -- a terminal --------------------------------------------------------------------------------------


@dataclass
class Background:
    command: Command
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Shell:
    """A user's terminal: bash in `cwd`, the environment its `export` lines build, and the commands
    left running in other terminals."""

    cwd: Path
    env: dict[str, str]
    plane: ControlPlane
    logs: Path
    background: list[Background] = field(default_factory=list)
    finished: list[Background] = field(default_factory=list)
    done: dict[int, bool] = field(default_factory=dict)  # section -> completed
    outputs: dict[str, str] = field(default_factory=dict)  # command -> stdout
    after: dict[int, dict[str, Any]] = field(default_factory=dict)  # section -> snapshot() at its end

    def export(self, command: Command) -> None:
        name = command.text.removeprefix("export ").split("=", 1)[0]
        if name == "KUBECONFIG":
            # TEST STAND-IN: the kubeconfig `make dev-cluster` prints is the session's control plane.
            self.env[name] = str(self.plane.kubeconfig)
            return
        script = f'{command.text} && printf %s "${name}"'
        result = subprocess.run(
            ["bash", "-c", script], cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0 and result.stdout, f"{command.text}: {result.stderr}"
        self.env[name] = result.stdout

    def start(self, command: Command) -> None:
        log = self.logs / f"background-{len(self.background) + len(self.finished)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", command.text],
                cwd=self.cwd,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        bg = Background(command, proc, log)
        self.background.append(bg)
        if "kompile operator" in command.text:
            # Ready when its liveness endpoint answers; the next command may rely on it.
            url = f"http://127.0.0.1:{self.env['KOMPILE_HEALTH_PORT']}/healthz"
            wait_for(f"{command.text} to answer {url}", lambda: self._alive(bg) and probe(url) is None, 120)

    def _alive(self, bg: Background) -> bool:
        assert bg.proc.poll() is None, f"`{bg.command.text}` exited:\n{bg.log.read_text()[-3000:]}"
        return True

    def run(self, command: Command) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            ["bash", "-o", "pipefail", "-c", command.text],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        timeout = WAIT_TIMEOUT if "--timeout=" in command.text else COMMAND_TIMEOUT
        deadline = time.monotonic() + timeout
        while True:
            try:
                out, err = proc.communicate(timeout=2)
                break
            except subprocess.TimeoutExpired:
                # A long wait fails early when what it waits on (the operator) has died.
                dead = [b for b in self.background if b.proc.poll() is not None]
                if dead or time.monotonic() > deadline:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.communicate()
                    for bg in dead:
                        self._alive(bg)
                    raise AssertionError(f"`{command.text}` ran past {timeout:.0f}s") from None
        result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        self.outputs[command.text] = out
        return result

    def stop_background(self) -> None:
        """Ctrl-C in the other terminals (SIGTERM, then SIGKILL what is left)."""
        for bg in reversed(self.background):
            if bg.proc.poll() is None:
                os.killpg(bg.proc.pid, signal.SIGTERM)
                try:
                    bg.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(bg.proc.pid, signal.SIGKILL)
                    bg.proc.wait()
        self.finished += self.background
        self.background = []

    def section(self, number: int) -> None:
        """Run a section's commands in order (once); earlier sections first, as a reader would."""
        for before in range(2, number):
            if before not in self.done:
                self.section(before)
            if not self.done[before]:
                pytest.fail(f"section {before} of the tutorial did not complete")
        if number in self.done:
            return
        self.done[number] = False
        for command in commands(number):
            self.step(command)
        self.after[number] = self.snapshot()
        self.done[number] = True

    def snapshot(self) -> dict[str, Any]:
        """The example's CompiledModel (None once deleted) and its Jobs as they are now. A section's
        test reads the snapshot taken at the section's end: a later section changes them (section 4
        deletes them), and the tests run in any order."""
        got = self.plane.kubectl("get", "cmodel", EXAMPLE, "-n", NS, "-o", "json", check=False)
        cmodel = json.loads(got.stdout) if got.returncode == 0 else None
        jobs = _get(self.plane, "jobs", "-n", NS, "-l", f"kompile.dev/compiledmodel={EXAMPLE}")["items"]
        return {"cmodel": cmodel, "jobs": jobs}

    def step(self, command: Command) -> None:
        if command.stop:
            self.stop_background()
            return
        if command.text == "make dev-cluster":
            return  # run by test_make_dev_cluster_starts_a_control_plane; its cluster is stood in
        if command.text.startswith("export "):
            self.export(command)
            return
        if command.background:
            self.start(command)
            return
        result = self.run(command)
        where = f"`{command.text}`:\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
        if "auth can-i" in command.text:
            # The comment is the expected answer; kubectl says "no" with exit status 1.
            assert command.comment in ("yes", "no"), f"can-i without an expected answer: {command.text}"
            assert (result.stdout.strip(), result.returncode) == (
                command.comment,
                0 if command.comment == "yes" else 1,
            ), where
        else:
            assert result.returncode == 0, where


# -- fixtures ----------------------------------------------------------------------------------------


def _workdir(root: Path) -> Path:
    """A folder that looks like the repository to the commands, so what they write stays out of it."""
    root.mkdir()
    for name in ("examples", "crds", "helm", "devtools", "Makefile"):
        (root / name).symlink_to(ROOT / name)
    scripts = root / "scripts"
    scripts.mkdir()
    for script in (ROOT / "scripts").iterdir():
        (scripts / script.name).symlink_to(script)
    (scripts / "setup-venv.sh").unlink()
    (scripts / "setup-venv.sh").write_text(SETUP_VENV_STANDIN)
    (scripts / "setup-venv.sh").chmod(0o755)
    return root


def _base_env(bin_dir: Path) -> dict[str, str]:
    (bin_dir / "kompile").write_text(KOMPILE_SHIM)
    (bin_dir / "kompile").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}  # the tutorial exports it
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        # The operator's default ports (8080, 9090) may be taken on a shared machine.
        KOMPILE_HEALTH_PORT=str(free_port()),
        KOMPILE_METRICS_PORT=str(free_port()),
    )
    return env


def _decide(pod: dict[str, Any]) -> tuple[int, str]:
    """TEST STAND-IN for a compile on hardware this machine lacks: a validated result, published at
    the content address as a real compile container would."""
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env", [])}
    t = json.loads(env["KOMPILE_TARGET"])
    prefix = env["KOMPILE_ARTIFACT_PREFIX"]
    compact = success_result(t["name"], t["backend"], t.get("precision", "fp32"), artifact_uri=prefix)
    publish_entry(prefix, compact)
    return 0, compact


@pytest.fixture(scope="module")
def shell(
    control_plane: ControlPlane, sim_fleet: KubeletStandIn, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Shell]:
    tmp = tmp_path_factory.mktemp("tutorial")
    (tmp / "bin").mkdir()
    (tmp / "logs").mkdir()
    sh = Shell(_workdir(tmp / "repo"), _base_env(tmp / "bin"), control_plane, tmp / "logs")
    reporter = KwokReporter(control_plane.kubeconfig, NS, _decide).start()
    try:
        yield sh
    finally:
        sh.stop_background()
        reporter.stop()
        if not sh.done.get(4):  # leave no release behind for later tests
            helm = str(find_bin_dir() / "helm")
            subprocess.run(
                [helm, "uninstall", RELEASE, "-n", SYSTEM_NS, "--ignore-not-found"],
                env=control_plane.env(),
                capture_output=True,
                timeout=120,
            )
        print(f"\ntutorial logs: {tmp / 'logs'}")


def _get(plane: ControlPlane, *args: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(plane.kubectl("get", *args, "-o", "json").stdout)
    return out


# -- the tests -------------------------------------------------------------------------------------


def test_tutorial_sections_hold_the_commands_the_tests_check() -> None:
    texts = {n: [c.text for c in commands(n)] for n in (2, 3, 4)}
    assert texts[2][0] == "make dev-cluster" and commands(2)[0].background
    assert any(t.startswith("kubectl wait -n ml --for=condition=Ready") for t in texts[2])
    assert any(t.startswith("helm install kompile helm/kompile") for t in texts[3])
    assert sum("auth can-i" in t for t in texts[3]) >= 6
    assert any(t.startswith("helm uninstall kompile") for t in texts[4])
    # In the background: the dev cluster and the two operators, nothing else.
    background = [c.text for n in (2, 3, 4) for c in commands(n) if c.background]
    assert len(background) == 3 and all(t.endswith("kompile operator") for t in background[1:]), background
    # Each operator is stopped before the next starts, and before its release's RBAC goes.
    assert commands(3)[0].stop and [c.stop for c in commands(4)] == [False, True, False]


def test_make_dev_cluster_starts_a_control_plane(tmp_path: Path) -> None:
    """`make dev-cluster` as written: it comes up, prints the line the next block pastes, serves the
    CRD, and stops its servers on Ctrl-C (SIGINT to its process group, as a terminal sends it)."""
    (first,) = [c for c in commands(2) if c.text == "make dev-cluster"]
    cwd = _workdir(tmp_path / "repo")
    (tmp_path / "bin").mkdir()
    env = _base_env(tmp_path / "bin")
    log = tmp_path / "make.log"
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", first.text],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def printed() -> str | None:
            assert proc.poll() is None, f"make dev-cluster exited:\n{log.read_text()[-3000:]}"
            found = re.search(r"^export KUBECONFIG=(\S+)$", log.read_text(), flags=re.M)
            return found.group(1) if found else None

        kubeconfig = wait_for("make dev-cluster to print its kubeconfig", printed, timeout=180)
        up = time.monotonic() - began
        # The tutorial's placeholder has the shape of the printed line.
        (pasted,) = [c.text for c in commands(2) if c.text.startswith("export KUBECONFIG=")]
        shape = re.escape(pasted.removeprefix("export KUBECONFIG=")).replace("XXXX", r"\w+")
        assert re.fullmatch(shape.replace("/tmp/", r".*/"), kubeconfig), (pasted, kubeconfig)
        kubectl = str(find_bin_dir() / "kubectl")
        established = "jsonpath={.status.conditions[?(@.type=='Established')].status}"
        result = subprocess.run(
            [
                kubectl,
                "--kubeconfig",
                kubeconfig,
                "get",
                "crd",
                "compiledmodels.kompile.dev",
                "-o",
                established,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.stdout == "True", result.stderr
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=30)
    # The dev cluster stops its servers, then says so; nothing of it is left running.
    wait_for("make dev-cluster to stop", lambda: "stopped" in log.read_text(), timeout=60)
    probe = [kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz", "--request-timeout=5s"]
    assert subprocess.run(probe, capture_output=True, timeout=60).returncode != 0, "its API server still runs"
    # Its temp folder (etcd's data, certificates, logs) goes with it after a clean stop.
    wait_for("the dev cluster's temp folder to go", lambda: not Path(kubeconfig).parent.exists(), timeout=30)
    print(f"\nmake dev-cluster: up in {up:.1f}s")


def test_section_2_operator_compiles_the_example_per_hardware_class(shell: Shell) -> None:
    shell.section(2)
    obj = shell.after[2]["cmodel"]
    assert obj is not None, "section 2 left no CompiledModel"
    status = obj["status"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["Ready"]["status"] == "True", status
    targets = status["targets"]
    # Fleet mode: one target per (hardware class, precision) of the simulated fleet.
    assert {t["hardwareClass"] for t in targets} == set(CLASSES), targets
    assert len(targets) == 2 * len(CLASSES) and status["targetsReady"] == f"{len(targets)}/{len(targets)}"
    assert all(t["phase"] == "Succeeded" and t["validation"]["passed"] for t in targets), targets
    local = [t for t in targets if t["hardwareClass"] == LOCAL_CLASS]
    # This machine's class was compiled for real, on the node whose kubelet is stood in.
    assert {t["precision"] for t in local} == {"fp32", "int8"} and all(t["node"] == LOCAL_NODE for t in local)
    jobs = shell.after[2]["jobs"]
    assert len(jobs) == len(targets)
    listed = shell.outputs["kubectl get jobs -n ml -l kompile.dev/compiledmodel=small-cnn"]
    assert all(j["metadata"]["name"] in listed for j in jobs)
    wide = shell.outputs["kubectl get cmodel -n ml -o wide"].splitlines()
    assert wide[0].split() == ["NAME", "READY", "TARGETS", "BEST", "SPEEDUP", "REASON", "AGE"], wide
    assert wide[1].split()[:3] == ["small-cnn", "True", f"{len(targets)}/{len(targets)}"], wide
    assert "Events:" in shell.outputs["kubectl describe cmodel -n ml small-cnn"]


def test_section_3_chart_operator_reaches_ready_under_its_service_account(shell: Shell) -> None:
    shell.section(3)
    assert "STATUS: deployed" in shell.outputs["helm status kompile -n kompile-system"]
    settings = shell.outputs["kubectl set env deployment/kompile -n kompile-system --list"]
    store = f"file://{shell.cwd}/.kompile/cluster-artifacts"
    assert "KOMPILE_NAMESPACES=ml" in settings and f"KOMPILE_ARTIFACT_STORE={store}" in settings
    # The operator ran with the ServiceAccount's token, not the admin certificate.
    operator_kubeconfig = yaml.safe_load((shell.cwd / ".kompile" / "operator.kubeconfig").read_text())
    users = {u["name"]: u["user"] for u in operator_kubeconfig["users"]}
    context = {c["name"]: c["context"] for c in operator_kubeconfig["contexts"]}
    user = users[context[operator_kubeconfig["current-context"]]["user"]]
    assert set(user) == {"token"}, set(user)
    obj = shell.after[3]["cmodel"]
    assert obj is not None, "section 3 left no CompiledModel"
    status = obj["status"]
    assert {c["type"]: c["status"] for c in status["conditions"]}["Ready"] == "True", status
    assert all(t["cached"] and t["reason"] == "CacheHit" for t in status["targets"]), status["targets"]
    reasons = shell.outputs["kubectl get cmodel -n ml small-cnn -o jsonpath='{.status.targets[*].reason}'"]
    assert reasons.split() == ["CacheHit"] * len(status["targets"])
    ran = shell.finished + shell.background
    (chart_operator,) = [b for b in ran if "operator.kubeconfig" in b.command.text]
    log = chart_operator.log.read_text()
    # Every call it made was allowed by the chart's RBAC.
    assert not refused_calls(log), log[-3000:]


def test_section_3_values_for_a_real_cluster_are_accepted() -> None:
    """The values file the tutorial shows passes the chart's schema and grants its one Secret."""
    (values,) = blocks(3, "yaml")
    helm = str(find_bin_dir() / "helm")
    chart = str(ROOT / "helm" / "kompile")
    cmd = [helm, "template", RELEASE, chart, "-n", SYSTEM_NS, "-f", "-"]
    result = subprocess.run(cmd, input=values, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    docs = [d for d in yaml.safe_load_all(result.stdout) if d]
    (role,) = [d for d in docs if d["kind"] == "Role" and d["metadata"]["namespace"] == NS]
    secrets = [r for r in role["rules"] if "secrets" in r["resources"]]
    assert secrets == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["kompile-s3"], "verbs": ["get"]}
    ]


def test_section_4_cleans_up(shell: Shell) -> None:
    shell.section(4)
    plane = shell.plane
    assert plane.kubectl("get", "clusterrole", f"{RELEASE}-cluster", check=False).returncode != 0
    assert plane.kubectl("get", "role", RELEASE, "-n", NS, check=False).returncode != 0
    assert plane.kubectl("get", "cmodel", "small-cnn", "-n", NS, check=False).returncode != 0
    # Helm leaves the chart's CRDs in place: other CompiledModels keep existing.
    plane.kubectl("get", "crd", "compiledmodels.kompile.dev")
