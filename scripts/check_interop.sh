#!/usr/bin/env bash
# Checks tokenmix's token files and caches against the reference implementations: megatron-core's IndexedDataset,
# datatrove's readers and writers, and Levanter's cache. They pull in torch and Ray, so they live in two venvs of their
# own (not the dev install):
#   scripts/check_interop.sh                 # creates .venv-interop and .venv-interop-levanter, then runs both checks
# Environment:
#   PYTHON             interpreter for the venvs (default python3.11)
#   INTEROP_VENV       venv for megatron-core + datatrove (default .venv-interop)
#   LEVANTER_VENV      venv for Levanter (default .venv-interop-levanter)
#   LEVANTER_SPEC      what pip installs as Levanter: a local checkout or a git URL (default: the git repository)
#   SKIP_INSTALL=1     reuse the venvs as they are
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.11}
INTEROP_VENV=${INTEROP_VENV:-.venv-interop}
LEVANTER_VENV=${LEVANTER_VENV:-.venv-interop-levanter}
LEVANTER_SPEC=${LEVANTER_SPEC:-"levanter @ git+https://github.com/stanford-crfm/levanter.git"}

if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then
  "$PYTHON" -m venv "$INTEROP_VENV"
  "$INTEROP_VENV/bin/pip" install -q -e . torch megatron-core datatrove
  "$PYTHON" -m venv "$LEVANTER_VENV"
  # gitpython and chex: Levanter imports them without declaring them (at commit 9263f81)
  "$LEVANTER_VENV/bin/pip" install -q -e . "$LEVANTER_SPEC" gitpython chex
fi
"$INTEROP_VENV/bin/python" scripts/interop/check_megatron_datatrove.py
"$LEVANTER_VENV/bin/python" scripts/interop/check_levanter.py
echo "interop checks passed"
