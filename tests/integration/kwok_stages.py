"""kwok Stages for the simulated fleet: kwok's defaults, except that a kompile compile pod completes
only when the test has annotated it with the result it should report (TEST STAND-IN for what a real
compile container would write). The test decides the exit code and the termination message; other
Job pods still complete through kwok's default pod-complete Stage.
"""

from __future__ import annotations

from pathlib import Path

import yaml

COMPILE_POD_LABEL = "kompile.dev/compiledmodel"
EXIT_CODE = "kompile.test/exit-code"
MESSAGE = "kompile.test/message"

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


def write_stages(defaults: Path, out: Path) -> Path:
    """kwok's default Stages, pod-complete narrowed to non-compile pods, plus the two report Stages."""
    kept = [d for d in yaml.safe_load_all(defaults.read_text()) if d]
    for doc in kept:
        if doc.get("metadata", {}).get("name") == "pod-complete":
            doc["spec"]["selector"]["matchExpressions"].append(
                {"key": f'.metadata.labels["{COMPILE_POD_LABEL}"]', "operator": "DoesNotExist"}
            )
    for name, op, reason, phase in (
        ("success", "In", "Completed", "Succeeded"),
        ("failure", "NotIn", "Error", "Failed"),
    ):
        text = _REPORT.format(
            name=name, op=op, reason=reason, phase=phase, exit_code=EXIT_CODE, message=MESSAGE
        )
        kept.append(yaml.safe_load(text))
    out.write_text(yaml.safe_dump_all(kept, sort_keys=False))
    return out
