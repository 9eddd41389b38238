# specfleet: `make demo` and `make test` are the contract (docs/lab.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
LAB := $(PY) -m lab
HOSTS ?= pcie=1,b200=1,gateway=1
# The demo's API key (16 to 512 characters): workers behind the gateway listen on the lab
# network (lab/group_data/lab.py), so they need one.
DEMO_KEY ?= lab-demo-key-not-a-secret
# The gateway's control-plane key (registering workers), which clients do not hold.
DEMO_ADMIN_KEY ?= lab-demo-admin-key-not-a-secret

.PHONY: demo demo-check test deps venv lab-up lab-down lab-status speed bench clean

# Python writes the bytecode of what it imports, as on a user's machine: make test starts a few hundred
# controller processes (pyinfra runs, the lab's tools) over the same modules, and an environment that sets
# PYTHONDONTWRITEBYTECODE would have each of them compile every module again.
unexport PYTHONDONTWRITEBYTECODE

# Debian packages the lab needs on the controller (nspawn, debootstrap, ssh, venv; apt-utils
# and gpg build the lab's signed NVIDIA apt repository).
deps:
	@command -v systemd-nspawn >/dev/null && command -v debootstrap >/dev/null \
	  && command -v ssh >/dev/null && $(PYTHON) -c 'import ensurepip' 2>/dev/null \
	  && command -v apt-ftparchive >/dev/null && command -v gpg >/dev/null \
	  || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	       systemd-container debootstrap openssh-client iproute2 python3-venv apt-utils gpg >/dev/null; }

# The controller's runtime (requirements.txt) and the tools beside it (requirements-dev.txt): tests,
# the lab, bench.py's plots, the lock compiler. Users install the same with `pip install -e '.[dev]'`.
venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
	  || { echo "specfleet needs Python >= 3.11 on the controller ($(PYTHON) is older)" >&2; exit 1; }
	$(PYTHON) -m venv $(VENV)
	@# uv, requirements-dev.txt's pin, installs the rest: 5 s from a cold cache where pip took 60 s on this
	@# 2-core machine. uv reads no pip.conf, so where it cannot reach the index pip installs them instead.
	$(VENV)/bin/pip install -q --disable-pip-version-check $$(sed -n 's/^\(uv==[^ ]*\).*/\1/p' requirements-dev.txt)
	$(VENV)/bin/uv pip install -q --python $(PY) -r requirements.txt -r requirements-dev.txt \
	  || $(VENV)/bin/pip install -q --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
	touch $@

lab-up: deps venv
	$(LAB) up --hosts $(HOSTS)

lab-down: venv
	$(LAB) down

lab-status: venv
	$(LAB) status

# The deploy's whole output scrolls past (and stays in DEMO_LOG); the last screen is the run's summary, repeated
# below pyinfra's per-operation results, and one completion through the gateway, labelled. 88 s on the 2-core
# machine once the lab's root filesystems and the hosts' wheels exist (a new machine builds those first).
DEMO_LOG ?= /tmp/specfleet-demo-deploy.log
demo: lab-up
	set -o pipefail; SPECFLEET_SITE= HF_TOKEN=hf_lab_granted SPECFLEET_API_KEY=$(DEMO_KEY) SPECFLEET_GATEWAY_ADMIN_KEY=$(DEMO_ADMIN_KEY) $(VENV)/bin/pyinfra -y lab/inventory.py deploy.py 2>&1 | tee $(DEMO_LOG)
	@echo; echo "The run's summary (the deploy's whole output: $(DEMO_LOG)):"
	@sed -n '/^--> Summary:/,/^--> /p' $(DEMO_LOG) | sed -e '1d' -e '$$d' -e '/^    \[/d' -e '/^$$/d'
	@echo; SPECFLEET_API_KEY=$(DEMO_KEY) $(LAB) ask hello

# What a user does next on the demo's lab (CI runs it after the demo): a plain re-run changes nothing,
# and the deployed-host checks pass against the lab's inventory.
demo-check: venv
	SPECFLEET_SITE= HF_TOKEN=hf_lab_granted SPECFLEET_API_KEY=$(DEMO_KEY) SPECFLEET_GATEWAY_ADMIN_KEY=$(DEMO_ADMIN_KEY) $(PY) -m tests.after_demo

# The whole suite, its files spread over WORKERS processes (pytest-xdist), each on a lab of its own
# (lab ids SPECFLEET_LAB_ID and the next ones; --lab lets tests/deployed boot and verify it): the lab's
# tests mostly wait on servers, smg's health windows and the stand-in's pace, so they overlap well on two
# cores: over four workers the processes of a whole run (process accounting, the lab's hosts included) used
# 29 CPU-min in 24 min, the 2 cores 60% busy; over six they were about 89% busy and pytest took 19 min 41 s
# and 20 min 47 s against four workers' 23 min 57 s, runs from fresh clones one after the other on this machine;
# with the suite grown to 1,765 tests, pytest took 22 min 38 s over six workers and 21 min 1 s over eight (22 min 52 s
# in a later run of eight), one run after
# the other on one tree. The files
# go out in the order tests/conftest.py gives them, the longest first (xdist's own reorder would put the files with the
# most tests first: the unit tests, leaving the long lab modules for the end). Then the lab's lifecycle tests,
# which tear the first lab down, while the other labs are torn down beside them; every lab is torn down
# whatever the outcome. No site directory: the suite tests the shipped data. The 40 slowest steps (a module's lab boot shows as its first test's setup) are what
# LONGEST_FIRST in tests/conftest.py is measured from.
WORKERS ?= 8
test: deps venv
	SPECFLEET_SITE= $(PY) -m pytest tests --lab -n $(WORKERS) --dist loadfile --no-loadscope-reorder -m "not lab_lifecycle" --durations=40; rc=$$?; \
	SPECFLEET_SITE= $(PY) -m pytest tests/lab_code -m lab_lifecycle & lifecycle=$$!; \
	for worker in $$(seq 1 $$(($(WORKERS) - 1))); do \
	  SPECFLEET_LAB_ID=$$(($${SPECFLEET_LAB_ID:-0} + worker)) $(LAB) down >/dev/null & done; \
	wait $$lifecycle || rc=1; wait; $(LAB) down >/dev/null; exit $$rc

# The toolkit's own speed series (speed/README.md); the serving benchmark users run is bench.py.
speed: deps venv
	$(PY) -m speed

bench:
	@echo "make bench is now make speed (the toolkit's speed series); the serving benchmark is bench.py" >&2; exit 2

clean: lab-down
	rm -rf $(VENV) build
