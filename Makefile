# The two commands a newcomer needs: `make run` (the main job) and `make test`.
# Everything else here is a convenience around cargo.

CARGO ?= cargo

.PHONY: run test bench lint fmt model-long

# The main job, until the server exists: the benchmark's quick comparison table
# (Ordo against eyeball-im-util and the naive baselines, measured in one run).
run:
	$(CARGO) run --release -p ordo-bench -- --quick

# Every test of the workspace, with every feature (the eyeball conversions included).
test:
	$(CARGO) test --workspace --all-features

# The full benchmark (a few minutes); `ARGS=--json` for JSON lines.
bench:
	$(CARGO) run --release -p ordo-bench -- $(ARGS)

lint:
	$(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(CARGO) fmt --all --check

fmt:
	$(CARGO) fmt --all

# The model test at length: 100 seeds of 2 000 steps (about 3 minutes).
model-long:
	ORDO_MODEL_SEEDS=100 ORDO_MODEL_STEPS=2000 $(CARGO) test --release -p ordo-core --all-features --test it model
