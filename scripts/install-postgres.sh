#!/usr/bin/env bash
# Installs PostgreSQL's server binaries (initdb, pg_ctl, postgres, psql) with
# apt-get when they are missing, so `make test` works on a fresh machine: the
# tests of ordo-pgsource start their own throw-away server from them (see
# crates/ordo-test-kit/src/postgres.rs). Does nothing when they are there.
#
# Usage: scripts/install-postgres.sh   (or `make postgres`)
# Env:   ORDO_POSTGRES_BIN_DIR: a directory holding initdb etc. to use instead.
set -euo pipefail

have_binaries() {
    if [ -n "${ORDO_POSTGRES_BIN_DIR:-}" ] && [ -x "$ORDO_POSTGRES_BIN_DIR/initdb" ]; then
        return 0
    fi
    compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null
}

if have_binaries; then
    echo "PostgreSQL binaries present: $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | tr '\n' ' ')${ORDO_POSTGRES_BIN_DIR:-}"
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "error: PostgreSQL (initdb) is missing and apt-get is not available: install PostgreSQL 15 or later, or set ORDO_POSTGRES_BIN_DIR" >&2
    exit 1
fi

sudo=""
if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
fi

# The tests start their own servers: the package's default cluster is not needed.
if [ ! -e /etc/postgresql-common/createcluster.conf ]; then
    $sudo mkdir -p /etc/postgresql-common
    echo "create_main_cluster = false" | $sudo tee /etc/postgresql-common/createcluster.conf >/dev/null
fi
echo "installing PostgreSQL with apt-get (once)"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends postgresql >/dev/null
have_binaries || { echo "error: after apt-get, no /usr/lib/postgresql/*/bin/initdb" >&2; exit 1; }
echo "PostgreSQL installed: $(ls -d /usr/lib/postgresql/*/bin | tr '\n' ' ')"
