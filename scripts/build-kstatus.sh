#!/usr/bin/env bash
# Build devtools/kstatus, a test tool that computes an object's status with the kstatus library
# (sigs.k8s.io/cli-utils, the code behind Flux's health checks), from the Go module proxy with the
# ordinary `go` command. Output: ~/.cache/kompile/kstatus-<hash of its sources>/bin, printed as the
# last line of stdout; a second run with the binary present does nothing and exits at once.
# The module and build caches are shared with build-control-plane.sh and build-s3-server.sh.
set -euo pipefail
cd "$(dirname "$0")/../devtools/kstatus"

CACHE_ROOT="${KOMPILE_CACHE:-$HOME/.cache/kompile}"
KEY=$(cat go.mod go.sum main.go | sha256sum | cut -c1-16)
OUT_DIR="$CACHE_ROOT/kstatus-$KEY"
BIN_DIR="$OUT_DIR/bin"

log() { printf '[build-kstatus] %s\n' "$*" >&2; }

if [[ -x "$BIN_DIR/kstatus" ]]; then
    echo "$BIN_DIR"
    exit 0
fi
command -v go >/dev/null || { log "ERROR: the go command is not on PATH (a Go toolchain builds kstatus)"; exit 1; }

export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off GOFLAGS=-mod=readonly
mkdir -p "$BIN_DIR" "$GOMODCACHE" "$GOCACHE"

# Two concurrent callers must not build into the same directory at once.
exec 9>"$OUT_DIR/.lock"
flock 9
if [[ -x "$BIN_DIR/kstatus" ]]; then
    echo "$BIN_DIR"
    exit 0
fi
start=$SECONDS
log "go build into $BIN_DIR"
go build -trimpath -ldflags "-s -w" -o "$OUT_DIR/kstatus.new" . >&2
mv -f "$OUT_DIR/kstatus.new" "$BIN_DIR/kstatus"  # a rename: no reader sees a half-written binary
log "built in $((SECONDS - start))s"
echo "$BIN_DIR"
