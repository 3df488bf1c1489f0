# The two commands a newcomer needs: `make run` (the main job) and `make test`.
# Everything else here is a convenience around cargo.

CARGO ?= cargo

.PHONY: run test bench bench-quick bench-store loadgen server-micro lint fmt model-long crash-long

# The main job: the server, on http://127.0.0.1:7070 with its data in ./ordo-data
# (`ARGS="--listen 0.0.0.0:8080 --data-dir /var/lib/ordo"` to change them).
run:
	$(CARGO) run --release -p ordo-server --bin ordo -- serve $(ARGS)

# The engine benchmark's quick comparison table (Ordo against eyeball-im-util and
# the naive baselines, measured in one run).
bench-quick:
	$(CARGO) run --release -p ordo-bench -- --quick

# Every test of the workspace, with every feature (the eyeball conversions included).
test:
	$(CARGO) test --workspace --all-features

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
