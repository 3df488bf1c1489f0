#!/usr/bin/env bash
# `make cluster`: cluster mode on loopback (docs/SCALING.md). Starts a 3-node NATS
# JetStream cluster (client ports 4222-4224, routes 6222-6224, monitoring
# 8222-8224) and 3 Ordo nodes (7071-7073) with the demo, all data under
# ./cluster-data (kept between runs, like ./ordo-data for `make run`), prints
# every URL, and stops everything on Ctrl-C (or SIGTERM): Ordo nodes first
# (graceful), then the NATS servers; nothing is left running.
#
# Env: ORDO_BIN (default target/release/ordo), ORDO_NATS_SERVER (default
# .tools/bin/nats-server), CLUSTER_DATA (default ./cluster-data), ORDO_ARGS (extra
# `ordo serve` flags for every node, e.g. "--demo-rate 100").
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
ordo_bin="${ORDO_BIN:-$repo/target/release/ordo}"
nats_bin="${ORDO_NATS_SERVER:-$repo/.tools/bin/nats-server}"
data="${CLUSTER_DATA:-$repo/cluster-data}"
# sync_interval: always — every acknowledged entry is on disk on a quorum before
# its PubAck, so an acknowledged write survives all three machines losing power at
# once. Measured cost and the reasoning: docs/SCALING.md, docs/BENCHMARKS.md.
# CLUSTER_SYNC_INTERVAL=default drops the line (nats-server's 2 min).
sync_interval="${CLUSTER_SYNC_INTERVAL:-always}"

[ -x "$ordo_bin" ] || { echo "error: $ordo_bin missing: run 'make server-bin' (or 'make cluster')" >&2; exit 1; }
[ -x "$nats_bin" ] || { echo "error: $nats_bin missing: run 'make nats-server'" >&2; exit 1; }

nats_ports=(4222 4223 4224)
route_ports=(6222 6223 6224)
monitor_ports=(8222 8223 8224)
ordo_ports=(7071 7072 7073)
for port in "${nats_ports[@]}" "${route_ports[@]}" "${monitor_ports[@]}" "${ordo_ports[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
        echo "error: 127.0.0.1:$port is taken (another 'make cluster' running?)" >&2
        exit 1
    fi
done

mkdir -p "$data"
nats_pids=()
ordo_pids=()
sleeper=""

stop_all() {
    trap - INT TERM EXIT
    echo
    echo "cluster: stopping"
    [ -z "$sleeper" ] || kill "$sleeper" 2>/dev/null || true
    # Ordo first, gracefully (SIGTERM: flush, "stopped; last seq"), while the log is still up.
    for pid in "${ordo_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait_gone 10 "${ordo_pids[@]}"
    for pid in "${nats_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    wait_gone 10 "${nats_pids[@]}"
    echo "cluster: stopped (data kept in $data)"
}

# Waits up to $1 seconds for the pids to exit, then SIGKILLs whatever is left.
wait_gone() {
    local secs=$1
    shift
    local pid deadline=$((SECONDS + secs))
    for pid in "$@"; do
        while kill -0 "$pid" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
        if kill -0 "$pid" 2>/dev/null; then
            echo "cluster: pid $pid did not stop in ${secs} s: SIGKILL" >&2
            kill -KILL "$pid" 2>/dev/null || true
        fi
        wait "$pid" 2>/dev/null || true
    done
}
trap 'stop_all; exit 130' INT
trap 'stop_all; exit 143' TERM
trap 'stop_all' EXIT

# Waits up to 60 s for a line matching $2 in file $1, failing if process $3 died.
wait_for_line() {
    local file=$1 pattern=$2 pid=$3 deadline=$((SECONDS + 60))
    until grep -q "$pattern" "$file" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "error: process $pid exited; its log ($file):" >&2
            tail -20 "$file" >&2
            exit 1
        fi
        if [ $SECONDS -ge $deadline ]; then
            echo "error: no '$pattern' in $file after 60 s" >&2
            exit 1
        fi
        sleep 0.1
    done
}

routes=""
for port in "${route_ports[@]}"; do routes+="nats-route://127.0.0.1:$port, "; done
routes="${routes%, }"
sync_line=""
[ "$sync_interval" = "default" ] || sync_line="  sync_interval: $sync_interval"

for i in 0 1 2; do
    n=$((i + 1))
    dir="$data/nats-$n"
    mkdir -p "$dir"
    cat > "$dir/nats.conf" <<CONF
# Written by scripts/cluster.sh at every start.
server_name: nats$n
listen: 127.0.0.1:${nats_ports[$i]}
http: 127.0.0.1:${monitor_ports[$i]}
jetstream {
  store_dir: "$dir/jetstream"
$sync_line
}
cluster {
  name: ordo-local
  listen: 127.0.0.1:${route_ports[$i]}
  routes: [$routes]
}
CONF
    "$nats_bin" -c "$dir/nats.conf" > "$dir/nats.log" 2>&1 &
    nats_pids+=($!)
done
for i in 0 1 2; do
    wait_for_line "$data/nats-$((i + 1))/nats.log" "Server is ready" "${nats_pids[$i]}"
done

# One demo secret for the three nodes, so a demo user's token works on every node
# (a client failing over keeps its token).
secret="$data/demo-secret"
if [ ! -s "$secret" ]; then
    (umask 077 && head -c 32 /dev/urandom | base64 > "$secret")
fi

# Each node lists its local NATS server first (nearest), then the others.
for i in 0 1 2; do
    n=$((i + 1))
    urls="nats://127.0.0.1:${nats_ports[$i]}"
    for j in 0 1 2; do [ "$j" = "$i" ] || urls+=",nats://127.0.0.1:${nats_ports[$j]}"; done
    log="$data/ordo-$n.log"
    : > "$log"
    # One simulator for the cluster, on ordo1: each node's would write the same
    # rooms through the one stream (3x the rate). The others start at rate 0
    # (ORDO_DEMO_RATE, so a --demo-rate in ORDO_ARGS still wins; POST
    # /demo/simulator on a node starts its own).
    rate_env=()
    [ "$i" = 0 ] || rate_env=(env ORDO_DEMO_RATE=0)
    # shellcheck disable=SC2086 # ORDO_ARGS is a list of flags
    ${rate_env[@]+"${rate_env[@]}"} "$ordo_bin" serve --cluster "$urls" --listen "127.0.0.1:${ordo_ports[$i]}" \
        --data-dir "$data/ordo-$n" --node-name "ordo$n" --demo --auth-secret-file "$secret" \
        ${ORDO_ARGS:-} > "$log" 2>&1 &
    ordo_pids+=($!)
    # One at a time: the first node creates the stream and writes the demo rooms
    # (through the log); the next ones find them there.
    wait_for_line "$log" "listening on" "${ordo_pids[$i]}"
done

echo
echo "cluster: running (data and logs in $data; sync_interval: $sync_interval)"
echo "  NATS client URLs:  nats://127.0.0.1:${nats_ports[0]},nats://127.0.0.1:${nats_ports[1]},nats://127.0.0.1:${nats_ports[2]}"
for i in 0 1 2; do
    echo "  NATS nats$((i + 1)) monitoring: http://127.0.0.1:${monitor_ports[$i]}/jsz  (pid ${nats_pids[$i]})"
done
for i in 0 1 2; do
    port=${ordo_ports[$i]}
    echo "  ordo$((i + 1)): demo http://127.0.0.1:$port/demo  health http://127.0.0.1:$port/v1/health  metrics http://127.0.0.1:$port/metrics  (pid ${ordo_pids[$i]})"
done
echo "  clients take the list: http://127.0.0.1:7071,http://127.0.0.1:7072,http://127.0.0.1:7073"
echo "  demo simulator: on ordo1 only (the others at rate 0; POST /demo/simulator to change)"
echo "Ctrl-C stops all six processes."

# Wait until a signal, or until any process dies (then stop the rest and say which).
while true; do
    for pid in "${nats_pids[@]}" "${ordo_pids[@]}"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "cluster: process $pid exited on its own; see the logs in $data" >&2
            exit 1
        fi
    done
    sleep 1 &
    sleeper=$!
    wait "$sleeper" || true
done
