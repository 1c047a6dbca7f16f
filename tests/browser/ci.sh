#!/usr/bin/env bash
# CI stage: the web console (/ui/) in a real browser. Debian's headless Chromium and chromedriver drive the
# release binary's console against real nodes (one with tasks in every state, then a 3-node cluster); selenium
# is installed into a virtual environment under target/. Screenshots land in target/browser/screenshots/
# (`tests/browser/ci.sh --update-docs` also writes the small copies committed under docs/console/).
# Skips itself, saying so, when Chromium or chromedriver is not installed and cannot be installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/../.."

py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1 || ! "$py" -c 'import venv, ensurepip' 2>/dev/null; then
  echo "tests/browser/ci.sh: SKIPPED: no $py with venv (Debian: apt-get install python3-venv)"
  exit 0
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== apt-get install chromium chromium-driver"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 || true
  fi
fi
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "tests/browser/ci.sh: SKIPPED: Chromium or chromedriver is missing and could not be installed" \
    "(Debian: apt-get install chromium chromium-driver)"
  exit 0
fi

venv=target/browser-venv
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# selenium drives the browser; pillow shrinks the screenshots committed under docs/console/.
"$venv/bin/pip" install -q --disable-pip-version-check 'selenium>=4.20,<5' 'pillow>=10,<12'

# The static release build the image and the jepsen-like stages share (.ci/static-release.sh).
. .ci/static-release.sh
static_release_build -p raftq --bin raftq
export RAFTQ_BIN=$STATIC_RELEASE_DIR/raftq
"$venv/bin/python" tests/browser/test_console.py "$@"
