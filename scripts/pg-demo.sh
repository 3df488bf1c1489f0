#!/usr/bin/env bash
# The demo page on a chat kept in PostgreSQL (`make pg-demo`): a throw-away
# PostgreSQL in a temporary directory (initdb, a Unix socket there and no TCP
# port, `wal_level = logical`), a small chat schema (rooms, members with a
# foreign key to rooms, messages with one too) and its publication, seeded;
# `ordo serve --demo` following the three tables; and a writer that INSERTs a
# message every second, so the lists move. Ctrl-C stops everything and removes
# the directory.
#
# Usage: scripts/pg-demo.sh [ordo serve options, e.g. --listen 127.0.0.1:8080]
# Env:   ORDO_BIN (default target/release/ordo), ORDO_POSTGRES_BIN_DIR (else the
#        newest /usr/lib/postgresql/*/bin, else PATH), PG_DEMO_INTERVAL (seconds
#        between two written messages, default 1).
set -euo pipefail

repo_dir="$(cd "$(dirname "$0")/.." && pwd)"
ordo_bin="${ORDO_BIN:-$repo_dir/target/release/ordo}"
interval="${PG_DEMO_INTERVAL:-1}"
pg_user="ordo_demo"
publication="ordo_chat"

pg_bin_dir() {
    if [ -n "${ORDO_POSTGRES_BIN_DIR:-}" ]; then echo "$ORDO_POSTGRES_BIN_DIR"; return; fi
    local newest
    newest="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
    if [ -n "$newest" ]; then echo "$newest"; return; fi
    dirname "$(command -v initdb || { echo "error: no initdb: run scripts/install-postgres.sh" >&2; exit 1; })"
}

[ -x "$ordo_bin" ] || { echo "error: no $ordo_bin: build it with \`make server-bin\`" >&2; exit 1; }
bin_dir="$(pg_bin_dir)"
work_dir="$(mktemp -d "${TMPDIR:-/tmp}/ordo-pg-demo.XXXXXX")"
# PostgreSQL refuses to run as root: then it runs as `postgres`, which owns the directory.
run_pg=()
if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || { echo "error: running as root needs a \`postgres\` user to run PostgreSQL" >&2; exit 1; }
    chown postgres "$work_dir"
    run_pg=(runuser -u postgres --)
fi

ordo_pid=""
writer_pid=""
cleanup() {
    trap - EXIT INT TERM
    # Every step runs, whatever the one before it gave.
    set +e
    echo
    echo "pg-demo: stopping"
    if [ -n "$writer_pid" ]; then kill "$writer_pid" 2>/dev/null; wait "$writer_pid" 2>/dev/null; fi
    if [ -n "$ordo_pid" ]; then kill -INT "$ordo_pid" 2>/dev/null; wait "$ordo_pid" 2>/dev/null; fi
    [ -f "$work_dir/pg/postmaster.pid" ] && "${run_pg[@]}" "$bin_dir/pg_ctl" --pgdata "$work_dir/pg" --mode=fast --wait stop >/dev/null
    rm -rf "$work_dir"
    echo "pg-demo: stopped, $work_dir removed"
}
trap cleanup EXIT INT TERM

psql_cmd=("$bin_dir/psql" --host "$work_dir" --port 5432 --username "$pg_user" --dbname postgres
          --no-psqlrc --quiet --set ON_ERROR_STOP=1)
# The command the user is shown, for a shell of their own.
psql_shown="$bin_dir/psql -h $work_dir -U $pg_user postgres"

echo "pg-demo: PostgreSQL in $work_dir ($bin_dir)"
"${run_pg[@]}" "$bin_dir/initdb" --pgdata "$work_dir/pg" --username "$pg_user" --auth=trust \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
cat >>"$work_dir/pg/postgresql.conf" <<EOF
listen_addresses = ''
unix_socket_directories = '$work_dir'
port = 5432
wal_level = logical
max_wal_senders = 4
max_replication_slots = 4
EOF
"${run_pg[@]}" "$bin_dir/pg_ctl" --pgdata "$work_dir/pg" --log "$work_dir/pg.log" --wait start >/dev/null
"${psql_cmd[@]}" --file "$repo_dir/scripts/pg-demo.sql"

echo "pg-demo: starting ordo serve --demo, following rooms, members and messages"
"$ordo_bin" serve --demo --data-dir "$work_dir/ordo-data" \
    --pg-host "$work_dir" --pg-port 5432 --pg-user "$pg_user" --pg-database postgres \
    --pg-publication "$publication" --pg-slot ordo_chat \
    --pg-table rooms --pg-table 'members:::ref.room=rooms' --pg-table messages "$@" \
    > >(tee "$work_dir/ordo.out") &
ordo_pid=$!
# Ready when ordo says where it listens (or gone, if it refused to start).
until grep -q "listening on" "$work_dir/ordo.out" 2>/dev/null; do
    kill -0 "$ordo_pid" 2>/dev/null || { echo "error: ordo serve stopped" >&2; exit 1; }
    sleep 0.2
done

# A message every $interval seconds, by a member of its room (the trigger numbers it and moves the room).
(
    while true; do
        "${psql_cmd[@]}" --command "INSERT INTO messages (room, author, text)
            SELECT m.room, m.owner, t.line
            FROM (SELECT room, owner FROM members ORDER BY random() LIMIT 1) m,
                 (SELECT line FROM unnest(ARRAY['on my way', 'sounds good', 'see you there', 'who has the keys?',
                                                'done ✓', 'one more thing…', 'ça marche', '了解です']) line
                  ORDER BY random() LIMIT 1) t" >/dev/null || true
        sleep "$interval"
    done
) &
writer_pid=$!

url="$(grep -o 'http://[^ ]*/demo' "$work_dir/ordo.out" | head -n 1)"
cat <<EOF

pg-demo: the chat lives in PostgreSQL; Ordo follows it. Open $url
  (sign in as alice, bob, ...: each sees the rooms it is a member of, by latest message).
  A message every ${interval}s from the writer; write one yourself (it moves the room in its members' lists):
    $psql_shown -c "INSERT INTO messages (room, author, text) VALUES ('hike', 'alice', 'hello from psql')"
  Rename a room (every member's list re-sorts by name):
    $psql_shown -c "UPDATE rooms SET name = 'Weekend hike ⛰' WHERE id = 'hike'"
  Ctrl-C stops PostgreSQL, Ordo and the writer and removes $work_dir.
EOF
wait "$ordo_pid"
