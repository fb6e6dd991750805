#!/usr/bin/env bash
# Build a real S3-compatible server for the integration tests, from the Go module proxy with the
# ordinary `go` command (no Docker, no release tarballs): versitygw, the Versity S3 Gateway, whose
# `posix` backend serves buckets from plain directories (buckets are sub-directories, objects files).
# Output: ~/.cache/kompile/s3-versitygw-<version>/bin, printed as the last line of stdout.
# A second run with the binary present does nothing and exits at once.
#
# Version: versitygw v1.8.0, the newest on the proxy (its go.mod needs a recent Go; GOTOOLCHAIN=local
# refuses to download another toolchain, so an older local Go fails loudly instead). Changing it
# changes the output directory. The module and build caches are shared with build-control-plane.sh.
set -euo pipefail

VERSITYGW_VERSION="v1.8.0"
VERSITYGW_PKG="github.com/versity/versitygw/cmd/versitygw"

CACHE_ROOT="${KOMPILE_CACHE:-$HOME/.cache/kompile}"
OUT_DIR="$CACHE_ROOT/s3-versitygw-$VERSITYGW_VERSION"
BIN_DIR="$OUT_DIR/bin"
STAGE_DIR="$OUT_DIR/staging"  # go writes here; the finished binary is renamed into BIN_DIR
LOG_DIR="$OUT_DIR/logs"

log() { printf '[build-s3-server] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Fast path: nothing to do, no lock, no go invocation.
if [[ -x "$BIN_DIR/versitygw" ]]; then
    echo "$BIN_DIR"
    exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH (a Go toolchain is needed to build versitygw)"

# Keep the module and build caches under the shared cache so re-builds are warm; build with the local
# toolchain only (no toolchain download) and without cgo (a static binary, no C compiler needed).
export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
mkdir -p "$BIN_DIR" "$STAGE_DIR" "$LOG_DIR" "$GOMODCACHE" "$GOCACHE"

# Two concurrent callers (two pytest sessions) must not build into the same directory at once; the
# second waits here and then finds the binary.
exec 9>"$OUT_DIR/.lock"
flock 9
if [[ -x "$BIN_DIR/versitygw" ]]; then
    echo "$BIN_DIR"
    exit 0
fi

start=$SECONDS
log "versitygw $VERSITYGW_VERSION: go install into $BIN_DIR (log: $LOG_DIR/versitygw.log)"
if ! GOBIN="$STAGE_DIR" go install -trimpath -ldflags "-s -w" "$VERSITYGW_PKG@$VERSITYGW_VERSION" \
    >"$LOG_DIR/versitygw.log" 2>&1; then
    log "ERROR: building versitygw failed; last lines of $LOG_DIR/versitygw.log:"
    tail -n 30 "$LOG_DIR/versitygw.log" >&2 || true
    exit 1
fi
# A rename: a concurrent reader never sees a half-written binary in BIN_DIR.
mv -f "$STAGE_DIR/versitygw" "$BIN_DIR/versitygw"
"$BIN_DIR/versitygw" --help >/dev/null || die "the built versitygw does not run"
log "versitygw $VERSITYGW_VERSION: built in $((SECONDS - start))s"
echo "$BIN_DIR"
