# The two commands a newcomer needs: `make run` (the main job) and `make test`.
# Everything else here is a convenience around cargo.

CARGO ?= cargo

.PHONY: run serve cluster pg-demo nats-server postgres nats-sync test test-rust test-clients test-browser server-bin bench bench-quick bench-store loadgen server-micro lint fmt model-long crash-long vectors

# The main job: the server on http://127.0.0.1:7070 with its data in ./ordo-data,
# and the live chat demo at http://127.0.0.1:7070/demo (10 000 shared rooms, a
# traffic simulator). `ARGS="--listen 0.0.0.0:8080 --demo-rate 100"` to change them.
run:
	$(CARGO) run --release -p ordo-server --bin ordo -- serve --demo $(ARGS)

# The server alone, without the demo data and simulator.
serve:
	$(CARGO) run --release -p ordo-server --bin ordo -- serve $(ARGS)

# Cluster mode on loopback (docs/SCALING.md): a 3-node NATS JetStream cluster and
# 3 Ordo nodes with the demo, data in ./cluster-data; prints every URL, Ctrl-C
# stops them all.
cluster: nats-server server-bin
	scripts/cluster.sh

# The demo page on a chat kept in PostgreSQL (README, "Following PostgreSQL"): a
# throw-away PostgreSQL in a temporary directory with rooms, members and messages,
# `ordo serve --demo` following them, and a writer INSERTing a message a second;
# prints the URL and the psql command to write one yourself. Ctrl-C stops it all
# and removes the directory. `ARGS="--listen 127.0.0.1:8080"` for ordo serve.
pg-demo: postgres server-bin
	scripts/pg-demo.sh $(ARGS)

# nats-server v2.15.2 into .tools/bin (built with `go install`; skipped when present):
# the log of cluster mode, for `make cluster` and the cluster tests.
nats-server:
	scripts/install-nats-server.sh

# PostgreSQL's binaries (apt-get, skipped when present): the tests of the
# PostgreSQL source start their own throw-away server from them.
postgres:
	scripts/install-postgres.sh

# The engine benchmark's quick comparison table (Ordo against eyeball-im-util and
# the naive baselines, measured in one run).
bench-quick:
	$(CARGO) run --release -p ordo-bench -- --quick

# Every test: the workspace's (with every feature, the eyeball conversions
# included; the Rust client's against a real server too; the cluster tests against
# real nats-server processes, installed first by `nats-server`; the PostgreSQL
# source against throw-away PostgreSQL servers, installed first by `postgres`), the TypeScript and Python clients against the protocol corpus and a
# real server, and the demo in headless Chromium (installed with apt-get if missing).
test: test-rust test-clients test-browser

test-rust: nats-server postgres
	$(CARGO) test --workspace --all-features

ORDO_BIN := $(CURDIR)/target/release/ordo

server-bin:
	$(CARGO) build --release -p ordo-server --bin ordo

test-clients: server-bin
	cd clients/typescript && npm ci --no-audit --no-fund --loglevel=error && ORDO_BIN=$(ORDO_BIN) npm test
	ORDO_BIN=$(ORDO_BIN) clients/python/test.sh

test-browser: server-bin
	ORDO_BIN=$(ORDO_BIN) tests/browser/run.sh

# Rewrites protocol/vectors/*.json from a real server (after a protocol change).
vectors:
	ORDO_WRITE_VECTORS=1 $(CARGO) test -p ordo-server --test protocol_vectors

# The full benchmark (a few minutes); `ARGS=--json` for JSON lines.
bench:
	$(CARGO) run --release -p ordo-bench -- $(ARGS)

# The store's reopen benchmark: 1M rooms written to a fresh LMDB directory, then
# reopened (each run a fresh process) until the room-list window is ready.
bench-store:
	$(CARGO) run --release -p ordo-bench --bin store-bench -- $(ARGS)

# The server under load on loopback: chat (1 000 lists, 1 000 subscribers, 20 000
# updates/s) and leaderboard (1 000 subscribers on one window). `ARGS=--quick` for a short run.
loadgen:
	$(CARGO) build --release -p ordo-server --bin ordo
	$(CARGO) run --release -p ordo-bench --bin loadgen -- $(ARGS)

# JetStream's durability setting measured: publish-to-PubAck latency of an R3 file
# stream on a local 3-node NATS cluster, `sync_interval` default against `always`.
nats-sync: nats-server
	$(CARGO) run --release -p ordo-bench --bin nats-sync -- $(ARGS)

# The seed techniques of the server against their obvious alternatives.
server-micro:
	$(CARGO) run --release -p ordo-bench --bin server-micro -- $(ARGS)

lint:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) fmt --all --check

fmt:
	$(CARGO) fmt --all

# The model test at length: 100 seeds of 2 000 steps (about 3 minutes).
model-long:
	ORDO_MODEL_SEEDS=100 ORDO_MODEL_STEPS=2000 $(CARGO) test --release -p ordo-core --all-features --test it model

# The store's crash test at length: 1 000 SIGKILLs of a writing child (about 90 s).
crash-long:
	ORDO_CRASH_KILLS=1000 $(CARGO) test -p ordo-store --test crash
