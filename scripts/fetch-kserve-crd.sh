#!/usr/bin/env bash
# Fetch KServe's InferenceService CRD from the real KServe source, through the Go module proxy with
# the ordinary `go` command (the module zip holds config/crd/full/), for the integration tests.
# Output: ~/.cache/kompile/kserve-<version>/serving.kserve.io_inferenceservices.yaml, printed as the
# last line of stdout. A second run with the file present does nothing and exits at once.
#
# Version: v0.20.0, the newest KServe release the proxy serves here, and the first with
# `spec.canary` (canary rollouts in Standard mode). Usage: fetch-kserve-crd.sh [version]
set -euo pipefail

KSERVE_VERSION="${1:-v0.20.0}"
MODULE="github.com/kserve/kserve"
CRD_IN_MODULE="config/crd/full/serving.kserve.io_inferenceservices.yaml"

CACHE_ROOT="${KOMPILE_CACHE:-$HOME/.cache/kompile}"
OUT_DIR="$CACHE_ROOT/kserve-$KSERVE_VERSION"
OUT="$OUT_DIR/serving.kserve.io_inferenceservices.yaml"

log() { printf '[fetch-kserve-crd] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

if [[ -s "$OUT" ]]; then
    echo "$OUT"
    exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH"
# Share the module cache with scripts/build-control-plane.sh; never download a toolchain.
export GOMODCACHE="$CACHE_ROOT/go/mod" GOTOOLCHAIN=local GOWORK=off

log "downloading $MODULE@$KSERVE_VERSION from the module proxy"
# Run outside any module so no go.mod around us is touched.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
info="$(cd "$work" && go mod download -json "$MODULE@$KSERVE_VERSION")" \
    || die "go mod download $MODULE@$KSERVE_VERSION failed: $info"
# The JSON has one "Dir": "..." line (or "Error": "..." instead).
dir="$(printf '%s\n' "$info" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -n "$dir" && -d "$dir" ]] || die "no module directory in go's answer: $info"
[[ -s "$dir/$CRD_IN_MODULE" ]] || die "$CRD_IN_MODULE is not in $MODULE@$KSERVE_VERSION"

mkdir -p "$OUT_DIR"
# The module cache is read-only: copy, make it writable, and rename into place atomically.
tmp="$(mktemp "$OUT_DIR/.crd.XXXXXX")"
cp "$dir/$CRD_IN_MODULE" "$tmp"
chmod 0644 "$tmp"
mv "$tmp" "$OUT"
log "copied $CRD_IN_MODULE ($(wc -c <"$OUT") bytes)"
echo "$OUT"
