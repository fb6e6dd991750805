#!/usr/bin/env bash
# Build (once) everything `make test` needs, in three lanes at the same time: the project venv,
# the backends' own environments (pip: mostly waiting on downloads) and the Go builds (control
# plane, S3 server, kstatus: CPU-bound). Cold on 2 cores the lanes overlap one another's waits;
# warm each script's fast path returns at once. Each step's output goes to a log under
# ${KOMPILE_CACHE:-~/.cache/kompile}/setup-logs; a failed step shows its last lines and fails the run.
#   scripts/setup-all.sh [ENV...]    (default envs: litert iree tvm xla)
set -uo pipefail
cd "$(dirname "$0")/.."
envs=("$@")
[ ${#envs[@]} -gt 0 ] || envs=(litert iree tvm xla)
logs="${KOMPILE_CACHE:-$HOME/.cache/kompile}/setup-logs"
mkdir -p "$logs"
start=$SECONDS

# Run one script with its output in its log; say how long it took, or show the log's tail.
step() {
  local name=$1 began=$SECONDS
  shift
  if "$@" >"$logs/$name.log" 2>&1; then
    (( SECONDS - began < 5 )) || echo "[setup] $name: ready in $((SECONDS - began)) s" >&2
    return 0
  fi
  echo "[setup] ERROR: $name failed ($*); last lines of $logs/$name.log:" >&2
  tail -n 30 "$logs/$name.log" >&2
  return 1
}

python_lane() { step venv scripts/setup-venv.sh && step tools scripts/install-tools.sh; }
envs_lane() {
  local e
  for e in "${envs[@]}"; do step "env-$e" scripts/setup-backend-env.sh "$e" || return 1; done
}
go_lane() {
  step control-plane scripts/build-control-plane.sh && step s3-server scripts/build-s3-server.sh &&
    step kstatus scripts/build-kstatus.sh && step kserve-crd scripts/fetch-kserve-crd.sh
}

python_lane & p1=$!
envs_lane & p2=$!
go_lane & p3=$!
failed=0
for pid in $p1 $p2 $p3; do wait "$pid" || failed=1; done
if (( failed )); then
  echo "[setup] failed after $((SECONDS - start)) s (the step's log is named above)" >&2
  exit 1
fi
(( SECONDS - start < 5 )) || echo "[setup] everything ready in $((SECONDS - start)) s" >&2
