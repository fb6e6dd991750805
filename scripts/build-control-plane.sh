#!/usr/bin/env bash
# Build the binaries of a real Kubernetes control plane for the integration tests, from the Go
# module proxy with the ordinary `go` command (no Docker, no release tarballs):
#   etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm,
# plus kwok's default Stages (etc/kwok-stages.yaml: the kwok binary embeds none).
# Output: ~/.cache/kompile/k8s-<versions key>/bin, printed as the last line of stdout.
# A second run with everything present does nothing and exits at once.
#
# Versions: Kubernetes v1.36.3 (newest stable patch on the proxy; its go.mod needs go >= 1.26.0),
# etcd v3.6.16 (newest patch of the 3.6 line that Kubernetes 1.36 pins), kwok v0.8.0 (built
# against Kubernetes 1.36), helm v3.22.0. Changing any of them changes the output directory.
set -euo pipefail

K8S_VERSION="v1.36.3"
ETCD_VERSION="v3.6.16"
KWOK_VERSION="v0.8.0"
HELM_VERSION="v3.22.0"
GO_MIN_MINOR=26

CACHE_ROOT="${KOMPILE_CACHE:-$HOME/.cache/kompile}"
KEY="${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}-helm-${HELM_VERSION}"
OUT_DIR="$CACHE_ROOT/k8s-$KEY"
BIN_DIR="$OUT_DIR/bin"
STAGE_DIR="$OUT_DIR/staging"  # go writes here; finished binaries are renamed into BIN_DIR
KWOK_STAGES="$OUT_DIR/etc/kwok-stages.yaml"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl)
ALL_BINS=(etcd "${K8S_BINS[@]}" kwok helm)

log() { printf '[build-control-plane] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# True when every named binary is present and executable in BIN_DIR.
have_bins() {
    local b
    for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

all_done() { have_bins "${ALL_BINS[@]}" && [[ -s "$KWOK_STAGES" ]]; }

# Fast path: nothing to do, no lock, no go invocation.
if all_done; then
    echo "$BIN_DIR"
    exit 0
fi

command -v go >/dev/null || die "the go command is not on PATH (Go >= 1.$GO_MIN_MINOR is needed)"
go_version="$(go env GOVERSION)"  # e.g. go1.26.8
go_minor="${go_version#go1.}"; go_minor="${go_minor%%.*}"
if ! [[ "$go_minor" =~ ^[0-9]+$ ]] || (( go_minor < GO_MIN_MINOR )); then
    die "$go_version is too old: Kubernetes $K8S_VERSION needs Go >= 1.$GO_MIN_MINOR"
fi

# Keep the module and build caches beside the binaries so re-builds are warm; build with the local
# toolchain only (no toolchain download) and without cgo (static binaries, no C compiler needed).
export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOTOOLCHAIN=local CGO_ENABLED=0 GOWORK=off
WORK_DIR="$OUT_DIR/work"
LOG_DIR="$OUT_DIR/logs"
mkdir -p "$BIN_DIR" "$STAGE_DIR" "$WORK_DIR" "$LOG_DIR" "$(dirname "$KWOK_STAGES")" "$GOMODCACHE" "$GOCACHE"

# Two concurrent callers (two pytest sessions) must not build into the same directory at once.
exec 9>"$OUT_DIR/.lock"
flock 9
if all_done; then
    echo "$BIN_DIR"
    exit 0
fi

# Print one field ("GoMod", "Dir") of `go mod download -json` for a module version.
mod_field() {
    go mod download -json "$1" | sed -n "s/^[[:space:]]*\"$2\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p"
}

# Move finished binaries from STAGE_DIR into BIN_DIR (a rename: never a half-written binary there).
publish() {
    local b
    for b in "$@"; do mv -f "$STAGE_DIR/$b" "$BIN_DIR/$b" || return 1; done
}

# Kubernetes: a wrapper module that requires k8s.io/kubernetes and swaps each of its
# `./staging/src/...` replacements (unusable outside its repository) for the published v0.Y.Z module.
build_k8s() {
    have_bins "${K8S_BINS[@]}" && { log "kubernetes $K8S_VERSION: already built"; return 0; }
    local dir="$WORK_DIR/kubernetes" upstream staging_version="v0${K8S_VERSION#v1}" minor godebug m
    minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
    log "kubernetes $K8S_VERSION: preparing wrapper module"
    upstream="$(mod_field "k8s.io/kubernetes@$K8S_VERSION" GoMod)"
    [[ -f "$upstream" ]] || { log "could not download k8s.io/kubernetes@$K8S_VERSION"; return 1; }
    godebug="$(grep -E '^godebug ' "$upstream" || true)"
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    {
        printf 'module kompile.dev/build/kubernetes\n\ngo 1.%s.0\n\n%s\n\n' "$GO_MIN_MINOR" "$godebug"
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        for m in "${K8S_BINS[@]}"; do echo "tool k8s.io/kubernetes/cmd/$m"; done
        echo
        echo "replace ("
        sed -n 's#^[[:space:]]*\(k8s.io/[^[:space:]]*\) => ./staging/src/.*#\1#p' "$upstream" |
            while read -r m; do echo "	$m => $m $staging_version"; done
        echo ")"
    } >"$dir/go.mod"
    grep -q ' => ' "$dir/go.mod" || { log "no staging replacements found in $upstream"; return 1; }

    # Stamp the release, or the binaries report v0.0.0-master and kubectl warns about version skew.
    local pkg ldflags="-s -w" pkgs=("${K8S_BINS[@]/#/k8s.io/kubernetes/cmd/}")
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.gitTreeState=clean"
    done
    log "kubernetes $K8S_VERSION: go mod tidy (downloads modules when cold)"
    (cd "$dir" && go mod tidy) >"$LOG_DIR/k8s.log" 2>&1 || return 1
    log "kubernetes $K8S_VERSION: go build ${K8S_BINS[*]} (the long step)"
    (cd "$dir" && go build -trimpath -ldflags "$ldflags" -o "$STAGE_DIR/" "${pkgs[@]}") \
        >>"$LOG_DIR/k8s.log" 2>&1 || return 1
    publish "${K8S_BINS[@]}" || return 1
    log "kubernetes $K8S_VERSION: done"
}

# etcd: the server module replaces its sibling modules (api, client, pkg) with `../` paths; the
# same wrapper trick points them at the published versions of the same release.
build_etcd() {
    have_bins etcd && { log "etcd $ETCD_VERSION: already built"; return 0; }
    local dir="$WORK_DIR/etcd" upstream m
    log "etcd $ETCD_VERSION: preparing wrapper module"
    upstream="$(mod_field "go.etcd.io/etcd/server/v3@$ETCD_VERSION" GoMod)"
    [[ -f "$upstream" ]] || { log "could not download go.etcd.io/etcd/server/v3@$ETCD_VERSION"; return 1; }
    rm -rf "$dir" && mkdir -p "$dir" || return 1
    {
        printf 'module kompile.dev/build/etcd\n\ngo 1.%s.0\n\n' "$GO_MIN_MINOR"
        echo "require go.etcd.io/etcd/server/v3 $ETCD_VERSION"
        echo
        echo "tool go.etcd.io/etcd/server/v3"
        echo
        echo "replace ("
        sed -n 's#^[[:space:]]*\(go.etcd.io/etcd/[^[:space:]]*\) => \.\./.*#\1#p' "$upstream" |
            while read -r m; do echo "	$m => $m $ETCD_VERSION"; done
        echo ")"
    } >"$dir/go.mod"
    log "etcd $ETCD_VERSION: go mod tidy + go build"
    # The module root is etcd's main package; -o names the binary (go would call it "server").
    (cd "$dir" && go mod tidy && go build -trimpath -ldflags "-s -w" -o "$STAGE_DIR/etcd" \
        go.etcd.io/etcd/server/v3) >"$LOG_DIR/etcd.log" 2>&1 || return 1
    publish etcd || return 1
    log "etcd $ETCD_VERSION: done"
}

# kwok and helm have no replace directives: a plain `go install pkg@version` builds them.
build_kwok() {
    have_bins kwok && [[ -s "$KWOK_STAGES" ]] && { log "kwok $KWOK_VERSION: already built"; return 0; }
    log "kwok $KWOK_VERSION: go install"
    GOBIN="$STAGE_DIR" go install -trimpath \
        -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}" \
        "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >"$LOG_DIR/kwok.log" 2>&1 || return 1
    write_kwok_stages || return 1
    publish kwok || return 1
    log "kwok $KWOK_VERSION: done"
}

# The Stages kwokctl uses by default, from the same kwok release: node initialize and heartbeat
# (with lease), pod ready, complete (Job pods) and delete.
write_kwok_stages() {
    local dir f
    dir="$(mod_field "sigs.k8s.io/kwok@$KWOK_VERSION" Dir)"
    [[ -d "$dir/kustomize/stage" ]] || { log "kwok $KWOK_VERSION source has no kustomize/stage"; return 1; }
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
        pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
        echo "---"
        cat "$dir/kustomize/stage/$f" || return 1
    done >"$KWOK_STAGES.tmp" && mv -f "$KWOK_STAGES.tmp" "$KWOK_STAGES"
}

build_helm() {
    have_bins helm && { log "helm $HELM_VERSION: already built"; return 0; }
    log "helm $HELM_VERSION: go install"
    GOBIN="$STAGE_DIR" go install -trimpath \
        -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >"$LOG_DIR/helm.log" 2>&1 || return 1
    publish helm || return 1
    log "helm $HELM_VERSION: done"
}

# Run a build step; on failure name its log and show its tail. The build functions check every
# command themselves: `set -e` is ignored inside functions called from `&&` or `if` contexts.
run_step() {
    local name="$1"
    if ! "build_$name"; then
        log "ERROR: building $name failed; last lines of $LOG_DIR/$name.log:"
        tail -n 30 "$LOG_DIR/$name.log" >&2 || true
        return 1
    fi
}

# Two lanes: Kubernetes (the big one) beside the three small builds, so one lane's downloads and
# links overlap the other's compiles. Go's build and module caches are safe for concurrent use.
start=$SECONDS
log "building into $BIN_DIR (logs: $LOG_DIR)"
run_step k8s & k8s_pid=$!
small_ok=0
{ run_step etcd && run_step kwok && run_step helm; } || small_ok=1
k8s_ok=0
wait "$k8s_pid" || k8s_ok=1
(( k8s_ok == 0 && small_ok == 0 )) || die "control plane build failed (see the logs above)"

all_done || die "build finished but files are missing from $OUT_DIR"
"$BIN_DIR/kube-apiserver" --version >&2
# sed, not head: head exits after one line and etcd, writing the rest, dies of SIGPIPE, which
# pipefail turns into a failed build (2 of 200 runs here).
"$BIN_DIR/etcd" --version | sed -n 1p >&2
log "built in $((SECONDS - start))s"
echo "$BIN_DIR"
