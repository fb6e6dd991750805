"""kwok Stages for the simulated fleet: kwok's defaults, except that a kompile compile pod completes
only when the test has annotated it with the result it should report (TEST STAND-IN for what a real
compile container would write). The test decides the exit code and the termination message; other
Job pods still complete through kwok's default pod-complete Stage.

A pod whose image is MISSING_IMAGE never starts: it stays Pending with its container waiting in
ImagePullBackOff, as a kubelet reports an image the registry does not have (TEST STAND-IN for the
kubelet's image pull).
"""

from __future__ import annotations

from pathlib import Path

import yaml

COMPILE_POD_LABEL = "kompile.dev/compiledmodel"
EXIT_CODE = "kompile.test/exit-code"
MESSAGE = "kompile.test/message"
MISSING_IMAGE = "registry.invalid/kompile/compile-missing:0.0.0"

_REPORT = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-report-{name}
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - {{key: '.metadata.deletionTimestamp', operator: DoesNotExist}}
    - {{key: '.status.phase', operator: In, values: [Running]}}
    - {{key: '.metadata.annotations["{exit_code}"]', operator: Exists}}
    - {{key: '.metadata.annotations["{exit_code}"]', operator: {op}, values: ['0']}}
  delay: {{durationMilliseconds: 200}}
  next:
    statusTemplate: |
      {{{{ $now := Now }}}}
      {{{{ $root := . }}}}
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          terminated:
            exitCode: {{{{ index $root.metadata.annotations "{exit_code}" }}}}
            message: {{{{ index $root.metadata.annotations "{message}" | Quote }}}}
            finishedAt: {{{{ $now | Quote }}}}
            reason: {reason}
            startedAt: {{{{ $now | Quote }}}}
      {{{{ end }}}}
      phase: {phase}
"""


_PULL_FAILS = """
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-image-pull-fails
spec:
  resourceRef: {{apiGroup: v1, kind: Pod}}
  selector:
    matchExpressions:
    - {{key: '.metadata.deletionTimestamp', operator: DoesNotExist}}
    - {{key: '.status.phase', operator: In, values: [Pending]}}
    - {{key: '.spec.nodeName', operator: Exists}}
    - {{key: '.spec.containers.[].image', operator: In, values: ['{image}']}}
    - {{key: '.status.containerStatuses.[].state.waiting.reason', operator: DoesNotExist}}
  delay: {{durationMilliseconds: 200}}
  next:
    statusTemplate: |
      containerStatuses:
      {{{{ range $index, $item := .spec.containers }}}}
      - image: {{{{ $item.image | Quote }}}}
        name: {{{{ $item.name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ImagePullBackOff
            message: {{{{ printf "Back-off pulling image %q" $item.image | Quote }}}}
      {{{{ end }}}}
      phase: Pending
"""


def write_stages(defaults: Path, out: Path) -> Path:
    """kwok's default Stages, pod-complete narrowed to non-compile pods and pod-ready to pods whose
    image is not MISSING_IMAGE, plus the two report Stages and the image pull that fails."""
    kept = [d for d in yaml.safe_load_all(defaults.read_text()) if d]
    for doc in kept:
        if doc.get("metadata", {}).get("name") == "pod-complete":
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.labels["{COMPILE_POD_LABEL}"]', "operator": "DoesNotExist"}
            )
        if doc.get("metadata", {}).get("name") == "pod-ready":
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": ".spec.containers.[].image", "operator": "NotIn", "values": [MISSING_IMAGE]}
            )
    for name, op, reason, phase in (
        ("success", "In", "Completed", "Succeeded"),
        ("failure", "NotIn", "Error", "Failed"),
    ):
        text = _REPORT.format(
            name=name, op=op, reason=reason, phase=phase, exit_code=EXIT_CODE, message=MESSAGE
        )
        kept.append(yaml.safe_load(text))
    kept.append(yaml.safe_load(_PULL_FAILS.format(image=MISSING_IMAGE)))
    out.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    return out
