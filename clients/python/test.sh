#!/usr/bin/env bash
# Runs the Python client's tests from a fresh clone, given python3 (>= 3.10):
# a venv in clients/python/.venv (made if missing), the package and its test
# dependencies installed into it, then pytest. Extra arguments go to pytest.
#
# The end-to-end tests start the server binary: $ORDO_BIN, by default
# <repo>/target/release/ordo. If that is missing and cargo is on the PATH it is
# built first (`cargo build --release -p ordo-server --bin ordo`); otherwise
# those tests fail and say how to build it.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e '.[test]'
if [ -z "${ORDO_BIN:-}" ] && [ ! -x ../../target/release/ordo ] && command -v cargo >/dev/null; then
    (cd ../.. && cargo build --release -p ordo-server --bin ordo)
fi
exec .venv/bin/python -m pytest "$@"
