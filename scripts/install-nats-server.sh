#!/usr/bin/env bash
# Installs nats-server (the JetStream log of cluster mode, docs/SCALING.md) into
# <repo>/.tools/bin/, built from source with `go install`, so `make test` and
# `make cluster` work on a fresh machine with only the toolchains. Skips the build
# when the binary there already reports the pinned version.
#
# Usage: scripts/install-nats-server.sh   (or `make nats-server`)
# Env:   NATS_SERVER_VERSION (default v2.15.2: the version the cluster tests and
#        the durability measurement in docs/BENCHMARKS.md were run against).
set -euo pipefail

version="${NATS_SERVER_VERSION:-v2.15.2}"
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin_dir="$repo/.tools/bin"
bin="$bin_dir/nats-server"

if [ -x "$bin" ]; then
    # `nats-server --version` prints "nats-server: v2.15.2".
    have="$("$bin" --version 2>/dev/null | awk '{print $NF}' || true)"
    if [ "$have" = "$version" ]; then
        echo "nats-server $version already installed at $bin"
        exit 0
    fi
    echo "nats-server at $bin reports '${have:-nothing}', want $version: reinstalling"
fi

if ! command -v go >/dev/null 2>&1; then
    cat >&2 <<MSG
error: 'go' not found on PATH.
Cluster mode's tests and 'make cluster' need nats-server $version, built here with Go
(https://go.dev/dl/; nats-server v2.15.2 needs Go >= 1.26, which a Go >= 1.21 downloads by itself). Install Go and run 'make nats-server' again, or point
ORDO_NATS_SERVER at an existing nats-server $version binary.
MSG
    exit 1
fi

mkdir -p "$bin_dir"
echo "building nats-server $version with $(go version | awk '{print $3}') into $bin_dir (1 to 10 minutes on a cold Go cache, with 2 cores; once)"
start=$(date +%s)
# Progress without go's package-by-package list: a line every 15 s until go is done.
( while sleep 15; do echo "  ... still building ($(( $(date +%s) - start )) s)"; done ) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null || true' EXIT
GOBIN="$bin_dir" go install "github.com/nats-io/nats-server/v2@$version"
kill "$ticker" 2>/dev/null || true
have="$("$bin" --version 2>/dev/null | awk '{print $NF}' || true)"
if [ "$have" != "$version" ]; then
    echo "error: after 'go install', $bin reports '${have:-nothing}', not $version" >&2
    exit 1
fi
echo "nats-server $version installed at $bin in $(( $(date +%s) - start )) s"
