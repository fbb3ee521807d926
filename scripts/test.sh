#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh machine, then runs them.
# Real components only: if a component cannot be installed or started, the run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# torch==2.13.0 resolves to the local CPU wheel on the project's machines (see README).
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore torch==2.13.0 -e '.[dev]'

python3 -m pytest -q "$@"
