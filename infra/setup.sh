#!/usr/bin/env bash
# Sets up everything scache needs on one machine, idempotently and mostly from caches:
#   - a virtualenv under $SCACHE_HOME keyed by a hash of requirements.lock (what it installs; pyproject.toml's
#     pins are the lock's, a unit test holds them, so an edit elsewhere in pyproject.toml rebuilds nothing)
#   - the encoder's ONNX export (the default onnx-int8 backend), under $SCACHE_HOME/models (keyed by the weights)
#   - the Kafka broker jars and the Flink Kafka connector jar, resolved with mvn (keyed by pom hash)
#   - with --browser: Debian's chromium for the dashboard's browser tests
# Prints the venv's python path as its last line.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
export SCACHE_HOME=${SCACHE_HOME:-$HOME/.cache/scache}
mkdir -p "$SCACHE_HOME"

want_browser=0
for arg in "$@"; do
  case $arg in
    --browser) want_browser=1 ;;
    *) echo "setup.sh: unknown option $arg" >&2; exit 2 ;;
  esac
done

say() { echo "[setup] $*" >&2; }

python_bin=${SCACHE_PYTHON:-python3}
if ! "$python_bin" -c 'import sys; assert sys.version_info[:2] == (3, 11)' 2>/dev/null; then
  echo "setup.sh: Python 3.11 is required ($python_bin is $("$python_bin" --version 2>&1)); set SCACHE_PYTHON" >&2
  exit 2
fi

lock_hash=$(sha256sum < "$repo/requirements.lock" | cut -c1-12)
venv="$SCACHE_HOME/venv-$lock_hash"
# One setup at a time per machine: two clones building the same venv would trample it.
exec 9>"$SCACHE_HOME/setup.lock"
flock 9
if [ ! -f "$venv/.complete" ]; then
  say "creating virtualenv $venv (first run: torch and Flink are large, a few minutes)"
  rm -rf "$venv"
  "$python_bin" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  # requirements.lock pins every package; --no-deps keeps pip from re-resolving.
  "$venv/bin/pip" install -q --no-deps -r "$repo/requirements.lock"
  "$venv/bin/pip" check >&2 || say "pip check reported the issues above"
  touch "$venv/.complete"
else
  say "virtualenv up to date ($venv)"
fi
ln -sfn "$venv" "$repo/.venv"
flock -u 9

command -v mvn >/dev/null || { echo "setup.sh: mvn (Maven) is required to resolve the Kafka and Flink jars" >&2; exit 2; }
command -v java >/dev/null || { echo "setup.sh: java (17+) is required for Kafka and Flink" >&2; exit 2; }
cd "$repo"
# The default encoder (onnx-int8) runs an export of the packaged weights, made here once (20-60 s) and
# cached under $SCACHE_HOME/models keyed by the weights' content and the library versions (~1 s when current).
PYTHONPATH="$repo" "$venv/bin/python" -m cache_core.embedding.export >&2
PYTHONPATH="$repo" "$venv/bin/python" -m infra.kafka.resolve >&2
PYTHONPATH="$repo" "$venv/bin/python" -m infra.flink.resolve >&2

if [ $want_browser = 1 ] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    say "installing Debian's chromium for the browser tests"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >&2
  else
    say "chromium missing and not root: browser tests will be skipped"
  fi
fi
echo "$venv/bin/python"
