# ddtree-deploy: the two set-up commands are `make demo` and `make test` (each installs first).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

.PHONY: install system-deps lint demo test test-unit bench matrix collection clean gpu-check gpu-check-dry

$(VENV)/.installed: pyproject.toml requirements/sglang-cpu.txt requirements/sglang-v2-cpu.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch 2.14.1 + torchvision 0.29.1: the pair that imports SGLang's utils (see docs/getting-started.md).
	$(PIP) install -q torch==2.14.1 torchvision==0.29.1
	$(PIP) install -q -r requirements/sglang-cpu.txt
	$(PIP) install -q --no-deps -r requirements/sglang-v2-cpu.txt
	$(PIP) install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

# sshd, GNU patch, git, rsync: installed with apt as root, else one line saying what to install.
system-deps:
	@bash scripts/system-deps.sh

# The lint and type gate (pyproject.toml [tool.ruff], [tool.mypy]: what each checks and why).
# `make test` runs the same two commands first, and fails on either.
lint: install
	$(PY) -m ruff check .
	$(PY) -m mypy

# The lint and type gate first (as `make lint`), then the suite in TEST_WORKERS parallel
# pytest-xdist workers (most of a test's time is waiting on subprocesses, sshd and deadlines,
# so more workers than cores pays; see docs/testing.md), whole
# modules per worker (their module fixtures are built once), the long modules first (the order
# tests/conftest.py gives), and the 30 slowest tests listed.
# pytest exits 5 when it collects no test: that is a failure here, never a pass.
# compileall first: the CLI processes and helpers the tests start then read our bytecode,
# where a PYTHONDONTWRITEBYTECODE=1 in the environment (this sandbox's sets one) had every one
# of them compile the package again (9% of the CLI-heavy e2e modules' CPU; docs/testing.md).
TEST_WORKERS ?= 4
test: system-deps install
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m compileall -q ddtree_deploy ddtree_testkit
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected" >&2; fi; exit $$rc

# The unit tier alone (tests/unit: no process, no sshd, no network; seconds): the quick loop
# while editing. tests/integration and tests/e2e run with it in `make test` (docs/testing.md).
test-unit: install
	$(PY) -m pytest -q tests/unit

demo: system-deps install
	$(PY) -m ddtree_deploy.demo$(if $(RELEASE), --release $(RELEASE))

bench: install
	$(PY) -m bench

matrix: install
	$(VENV)/bin/ddtree-deploy matrix --from 0.5.11

# The Ansible collection ddtree.deploy as a user installs it (docs/ansible.md, Install):
# COLLECTION_OUT/ddtree-deploy-VERSION.tar.gz, VERSION = galaxy.yml's, which is the toolkit's
# (tests/e2e/test_ansible_collection.py). Needs only ansible-galaxy (ansible-core): the venv's if
# there is one, else the one on PATH; no install step.
COLLECTION_OUT ?= dist
ANSIBLE_GALAXY ?= $(if $(wildcard $(VENV)/bin/ansible-galaxy),$(VENV)/bin/ansible-galaxy,ansible-galaxy)

collection:
	$(ANSIBLE_GALAXY) collection build ansible/ddtree --output-path $(COLLECTION_OUT) --force

# The GPU check (docs/gpu-checks.md). gpu-check-dry, on any machine with the venv: extract
# SGLang's files from the release wheel into GPU_CARRY (git-ignored), run every check's CPU
# path and measure what travels (< 64 MiB). gpu-check, on the lent GPU machine: no venv, its
# own python3 (torch, Triton, nvcc); carry GPU_CARRY with the command. 540 s leaves the
# device tool's 10-minute limit room to bring $OUT back.
GPU_CARRY ?= .gpu-carry/gpu-check
GPU_PYTHON ?= python3

gpu-check:
	timeout 540 $(GPU_PYTHON) scripts/gpu_check.py --carry $(GPU_CARRY)

gpu-check-dry: install
	$(PY) scripts/gpu_check.py --dry-run --prepare --carry $(GPU_CARRY)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache build/gpu-check
