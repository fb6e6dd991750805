#!/usr/bin/env bash
# Create (once) a backend's own environment, for a backend whose dependencies conflict with the
# project venv (another torch pin): scripts/setup-backend-env.sh NAME builds
# ${KOMPILE_CACHE:-~/.cache/kompile}/env-NAME-<hash of requirements/env-NAME.txt> from that pinned
# file and prints its path as its last line. The pipeline finds it there (or at
# KOMPILE_ENV_<NAME>) and runs the backend's steps in it as a subprocess
# (kompile.compile_jobs.env_runner). An environment without its .complete marker is half built:
# it is removed and built again.
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:?usage: scripts/setup-backend-env.sh NAME (e.g. litert)}
pins=requirements/env-$name.txt
if [ ! -f "$pins" ]; then
  echo "no $pins: known environments: $(ls requirements/env-*.txt | sed 's|.*/env-||; s|\.txt$||' | tr '\n' ' ')" >&2
  exit 2
fi
key=$(sha256sum "$pins" | cut -c1-16)
env="${KOMPILE_CACHE:-$HOME/.cache/kompile}/env-$name-$key"
if [ ! -x "$env/bin/python" ] || [ ! -f "$env/.complete" ]; then
  echo ">> creating $env from $pins (first run: torch is several GB, allow ~10 minutes)" >&2
  rm -rf "$env"
  if ! python3 -m venv "$env" 2>/dev/null; then
    # A Python without ensurepip (Debian's python3-venv not installed, as in NVIDIA's containers):
    # the venv without pip, then pip put into it by the system's pip (pip >= 22.3: --python).
    rm -rf "$env"
    python3 -m venv --without-pip "$env"
    python3 -m pip --python "$env/bin/python" install -q pip
  fi
  "$env/bin/python" -m pip install -q -U pip
  "$env/bin/python" -m pip install -q --progress-bar off --no-deps -r "$pins"
  "$env/bin/python" -m pip check >&2
  touch "$env/.complete"
fi
echo "$env"
