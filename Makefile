# gpupin: `make demo` shows the project on a simulated GPU host; `make test` runs every test from a clean clone.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY ?= python3
VENV := .venv
# Quoted: the checkout's path may hold spaces (every recipe that names a path of it quotes it).
VPY := "$(CURDIR)/$(VENV)/bin/python"
# The hook runs under dockerd's environment, so it gets an absolute interpreter, not a shim or a venv.
HOST_PYTHON := $(shell $(PY) -c 'import sys; print(sys.executable)' 2>/dev/null)
FAKEGPU := $(CURDIR)/build/fakegpu
export FAKEGPU_TOPOLOGY ?= $(CURDIR)/tests/fakegpu/scenarios/mixed-4.json
SANDBOX := tests/sandbox/sandbox.sh
# The runtimes the docker tier runs on, each in a sandbox of its own: Debian 12's Docker 20.10 (docker-compose 1.29),
# Debian 13's Engine 26 (compose v2, CDI) and sid's Engine 28.5 (compose v2.40, CDI on by default, DiscoveredDevices),
# unpacked under build/engines/ (GPUPIN_SANDBOX_ENGINE, sandbox.sh), and Debian 12's podman 4.3 (`podman`: the
# sandboxed podman service, podman.sh). ENGINES=20.10 (or "20.10 podman", ...) runs the tests on those alone.
ENGINES ?= 20.10 26 28.5 podman
DOCKER_ENGINES = $(filter-out podman,$(ENGINES))
# GPUPIN_SANDBOX_NAME=NAME runs one more sandbox beside the default one (a second checkout, a helper's worktree).
export GPUPIN_SANDBOX_NAME ?=
SANDBOX_RUN := /run/gpupin-sandbox$(if $(GPUPIN_SANDBOX_NAME),-$(GPUPIN_SANDBOX_NAME))
SANDBOX_HOST := unix://$(SANDBOX_RUN)/docker.sock
# What the host-side tools need to see the simulated cards (the same topology as the sandbox's hook).
SIMHOST := DOCKER_HOST=$(SANDBOX_HOST) LD_LIBRARY_PATH="$(FAKEGPU)/lib" FAKEGPU_TOPOLOGY="$(FAKEGPU_TOPOLOGY)"
TEST_IMAGE := gpupin:test
BASE_IMAGE := gpupin-base:bookworm

.PHONY: help setup fakegpu engine26 engine28.5 sandbox-up sandbox-down sandbox-purge slurm-up slurm-down wheels image \
	image-test test-tools test test-unit test-docker test-cluster test-gpu soak fuzz lint bench demo shell clean

help:
	@echo "make demo          show gpupin on the simulated mixed-4 GPU host (no GPU needed)"
	@echo "make shell         a shell on that simulated host, for your own hostagent commands"
	@echo "make test          install what is missing, build the fakes, start the sandbox, run every test (CI)"
	@echo "make test-unit     one tier (no daemon); make test-docker, test-cluster, test-gpu: the other tiers"
	@echo "                   (what each needs and runs: docs/testing.md; PYTEST_ARGS=... adds pytest arguments)"
	@echo "make soak          the resident agent's full 10-minute soak (make test runs a 90 s one)"
	@echo "make fuzz          the hypothesis tests with twenty times the examples, at random (profile fuzz)"
	@echo "make lint          ruff (check, format --check) and mypy, as CI runs them before the tests"
	@echo "make commit-subjects  every commit after SUBJECTS_SINCE has a subject of at most 72 characters (CI)"
	@echo "make golden        rewrite tests/golden (hostagent ls output) after a change that is meant"
	@echo "make readme        rewrite README.md's examples from runs on the simulated host"
	@echo "make bench         start-up and Docker-path benchmarks, as ratios against their floors"
	@echo "make bench-swarm   hostagent ls --swarm against docker node ls + service ps, on the three-node swarm"
	@echo "make dist          the sdist and the wheel into dist/"
	@echo "make image         the training image (BASE_IMAGE=... to change its base) from offline wheels"
	@echo "make sandbox-up    start the sandboxed Docker daemon (prints DOCKER_HOST); sandbox-down stops it"
	@echo "                   (GPUPIN_SANDBOX_ENGINE=26 or 28.5: that engine's; ENGINES=20.10 runs the tests on one)"
	@echo "make slurm-up      start the test Slurm (munged, slurmctld, slurmd; prints SLURM_CONF); slurm-down stops it"
	@echo "make podman-up     the sandboxed podman 4.3 service with the test image (prints DOCKER_HOST); podman-down"
	@echo "                   (PODMAN=5: Debian 13's podman 5.4 in a trixie root)"
	@echo "make test-podman   the docker tier's runtime tests and podman's own on the sandboxed podman (PODMAN=5 too)"
	@echo "make swarm-up      a three-node Docker Swarm of simulated GPU hosts (one line per node); swarm-down"

# apt waits up to 10 minutes for its lock (unattended-upgrades may hold it) instead of failing at once; on apt 2.6
# (Debian 12) DPkg::Lock::Timeout covers the lists lock of `update` too.
APT_GET := apt-get -o DPkg::Lock::Timeout=600

$(VENV)/.done: pyproject.toml
	@command -v gcc >/dev/null && $(PY) -c 'import venv, ensurepip' 2>/dev/null || { \
	  echo "setup: installing gcc and python3-venv"; $(APT_GET) update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq gcc make python3-venv >/dev/null; }
	$(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.done

fakegpu: setup
	$(MAKE) -s -C tests/fakegpu OUT=../../build/fakegpu PYTHON="$(HOST_PYTHON)"

sandbox-up: fakegpu
	@$(SANDBOX) up

# Engine 26 from Debian 13's packages, unpacked under build/engines/26 (sandbox-up fetches it too when needed);
# Engine 28.5 from sid's, under build/engines/28.5.
engine26:
	@GPUPIN_SANDBOX_ENGINE=26 $(SANDBOX) install
engine28.5:
	@GPUPIN_SANDBOX_ENGINE=28.5 $(SANDBOX) install

sandbox-down:
	@for e in $(ENGINES); do $(call SANDBOX_OF,$$e); $$sb down || exit 1; done

sandbox-purge:
	@for e in $(ENGINES); do $(call SANDBOX_OF,$$e); $$sb purge || exit 1; done

# The single-host Slurm of the simulated host (tests/cluster/test_slurm.py starts and stops its own).
slurm-up: fakegpu
	@tests/sandbox/slurm.sh up

slurm-down:
	@tests/sandbox/slurm.sh down

# Three dockerds in network namespaces of their own, one topology each, joined into one swarm; their gpupin:test
# comes from the sandbox (image-test). GPUPIN_SANDBOX_NAME names the cluster too.
.PHONY: swarm-up swarm-down
SWARM := tests/sandbox/swarm.sh
swarm-up: image-test
	@$(SWARM) up

swarm-down:
	@$(SWARM) down

# The sandboxed podman 4.3 service (tests/sandbox/podman.sh installs podman as docker.io is installed), with the test
# image built there by podman itself; tests/docker/test_podman.py runs against it (docs/podman.md). PODMAN=5: Debian
# 13's podman 5.4 instead, chrooted in a debootstrapped trixie root under build/podman5 (GPUPIN_PODMAN, podman.sh).
PODMAN ?= 4.3
export GPUPIN_PODMAN := $(PODMAN)
.PHONY: podman-up podman-down
podman-up: wheels fakegpu
	@$(call UP_WITH_TEST_IMAGE,podman)
	@tests/sandbox/podman.sh env | head -1

podman-down:
	@tests/sandbox/podman.sh down

# The docker tier on podman (docs/testing.md, The engines): its runtime tests (`per_engine`) against the sandboxed
# podman service (PODMAN=5: podman 5's), and podman's own (tests/docker/test_podman*.py, test_rootless.py: the
# rootless ones bring up and down a rootless podman of their own); the first Docker engine's sandbox is up too (the
# cross-runtime test, run by this target only: beside a Docker engine's run it would race that run's sandbox).
.PHONY: test-podman
test-podman: ENGINES := $(firstword $(ENGINES)) podman
test-podman: test-tools image-test
	@export $(REQUIRED) GPUPIN_TEST_ENGINES=podman GPUPIN_TEST_REQUIRE_PODMAN=1; $(call TIER,tests/docker,docker)

# Offline wheels for the image: gpupin itself and what its bare install needs (no docker SDK). The wheel is built
# in build isolation (setuptools from [build-system]), so the venv needs no setuptools or wheel of its own.
wheels: setup
	# setuptools reuses build/lib: a stale tree there would slip old modules into the wheel.
	rm -rf build/wheels build/lib build/bdist.* && mkdir -p build/wheels
	$(VPY) -m build -q --wheel -o build/wheels .
	$(VPY) -m pip download -q --no-deps --only-binary=:all: -d build/wheels \
	  "nvidia-ml-py==$$($(VPY) -c 'import importlib.metadata as m; print(m.version("nvidia-ml-py"))')"

# The sdist and the wheel, the wheel built from the unpacked sdist (so a file the sdist lacks fails here).
.PHONY: dist
dist: setup
	rm -rf dist
	$(VPY) -m build -q -o dist .
	@ls dist

BASE ?=
image: wheels
	docker build $(if $(BASE),--build-arg BASE_IMAGE=$(BASE)) -t gpupin:latest .

# The test image: the project's own Dockerfile on the sandbox's debootstrap base, on each engine's sandbox, built by
# that engine's own CLI (its output only on failure: Engine 26's CLI warns that the legacy builder is deprecated),
# the engines side by side (the shared debootstrap cache and each engine's fetch are locked in sandbox.sh). The
# engine `podman` is the sandboxed podman service, its image built by podman (podman.sh).
# Podman builds without a network (the image installs from the wheels; podman 5's chroot shares the host's network).
SANDBOX_OF = if [ "$(1)" = podman ]; then sb=tests/sandbox/podman.sh; cli="podman build --network none"; \
	  else sb="env GPUPIN_SANDBOX_ENGINE=$(1) $(SANDBOX)"; cli="docker build"; fi
UP_WITH_TEST_IMAGE = $(call SANDBOX_OF,$(1)); $$sb up >/dev/null || exit 1; \
	out=$$($$sb $$cli -q --build-arg BASE_IMAGE=$(BASE_IMAGE) -t $(TEST_IMAGE) . 2>&1) || \
	  { echo "$$out" >&2; echo "make: the test image did not build on $(1)" >&2; exit 1; }
image-test: wheels fakegpu
	@pids=; for e in $(ENGINES); do \
	  ( $(call UP_WITH_TEST_IMAGE,$$e) ) & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; exit $$rc

# pytest's 5 ("no tests ran") is a failure: a run that tested nothing never passes as green.
PYTEST = rc=0; $(VPY) -m pytest $(1) || rc=$$?; \
	  if [ $$rc = 5 ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The tiers (docs/testing.md, The tiers): TIER runs a tier's folder with its marker, or the test files PYTEST_ARGS
# names (one of another tier is deselected: "collected no tests"), with the target's own pytest arguments ($(3)).
TIER = $(call PYTEST,-m "$(2)" $(3) $(if $(findstring tests/,$(PYTEST_ARGS)),,$(1)) $(PYTEST_ARGS))
UNIT := not docker and not swarm and not slurm and not gpu
# The unit tier in two pytest-xdist workers: its tests are mostly processes started one after the other, so one
# pytest keeps one core busy (PYTEST_ARGS="-n 0" for one process, as for a single file or pdb).
UNIT_WORKERS ?= 2
# What the daemon and cluster tiers need: a missing daemon or cluster fails their tests (not skips) here.
REQUIRED = $(SIMHOST) GPUPIN_TEST_REQUIRE_DOCKER=1 GPUPIN_TEST_ENGINES="$(ENGINES)" \
	GPUPIN_TEST_REQUIRE_PODMAN=$(if $(filter podman,$(ENGINES)),1,0)

# Tools some tests drive besides Docker: zsh and fish (the completion scripts, completed by the shells themselves),
# Debian's chromium (the agent's dashboard, driven by Playwright from the dev extra: its own browser download is never
# used).
TEST_TOOLS := zsh fish chromium
test-tools:
	@missing=$$(for t in $(TEST_TOOLS); do command -v $$t >/dev/null || echo $$t; done); \
	if [ -n "$$missing" ]; then echo "make: installing" $$missing; $(APT_GET) update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq --no-install-recommends $$missing >/dev/null; fi

# The docker tier on several runtimes: one pytest per runtime, side by side. Each has a sandbox of its own (daemon,
# containerd, topology; the agents' sockets and the ledger locks are the tests' own), so the runs share nothing but
# the CPUs. The tests the runtime matters to (`per_engine`: the runtime paths) run in every run; the others (the
# parsing, the agent's own logic) are split between the Docker engines' runs, each run once (docs/testing.md, The
# engines), and podman's run takes podman's own. Each run's output, with its 15 slowest tests (where the time
# goes), is shown whole once all have ended (build/test-docker-ENGINE.log); a run that collects nothing fails only
# if every run does.
DOCKER_TIER = $(if $(word 2,$(ENGINES)),$(DOCKER_SIDE_BY_SIDE),$(call TIER,tests/docker,docker))
DOCKER_SIDE_BY_SIDE = mkdir -p build; pids=; echo "make: the docker tier on $(ENGINES) side by side"; \
	for e in $(ENGINES); do \
	  GPUPIN_TEST_ENGINES=$$e GPUPIN_TEST_SHARING_ENGINES="$(ENGINES)" $(VPY) -m pytest -m docker --durations=15 \
	    $(if $(findstring tests/,$(PYTEST_ARGS)),,tests/docker) $(PYTEST_ARGS) >build/test-docker-$$e.log 2>&1 & \
	  pids="$$pids $$!"; \
	done; rc=0; runs=0; empty=0; \
	for p in $$pids; do r=0; wait $$p || r=$$?; runs=$$((runs + 1)); \
	  if [ $$r = 5 ]; then empty=$$((empty + 1)); elif [ $$r != 0 ]; then rc=$$r; fi; \
	done; \
	for e in $(ENGINES); do echo "make: the docker tier on $$e:"; cat build/test-docker-$$e.log; done; \
	if [ $$empty = $$runs ]; then echo "make: pytest collected no tests" >&2; exit 1; fi; exit $$rc

# Every tier, as CI runs it: each tier's run (the docker tier's per engine), every one of them whatever the others
# gave. The unit tier runs beside the docker tier: the docker tier mostly waits on its daemons (a third of the two
# cores, measured), the unit tier keeps the cores busy; its output is shown whole when it ends
# (build/test-unit.log). With PYTEST_ARGS, one run of what it names.
test: test-tools image-test
ifeq ($(strip $(PYTEST_ARGS)),)
	@export $(REQUIRED); rc=0; mkdir -p build; \
	  echo "make: the unit tier beside the docker tier (its output when it ends: build/test-unit.log)"; \
	  echo "make: then the cluster tier, on sandboxes of its own (build/test-cluster.log)"; \
	  ( r=0; ( $(call TIER,tests/unit,$(UNIT),-n $(UNIT_WORKERS)) ) >build/test-unit.log 2>&1 || r=1; \
	    $(MAKE) -s --no-print-directory cluster-beside GPUPIN_SANDBOX_NAME=$(CLUSTER_SANDBOX_NAME) \
	      ENGINES="$(DOCKER_ENGINES)" >build/test-cluster.log 2>&1 || r=1; exit $$r ) & beside=$$!; \
	  ( $(DOCKER_TIER) ) || rc=1; \
	  wait $$beside || rc=1; echo "make: the unit tier:"; cat build/test-unit.log; \
	  echo "make: the cluster tier:"; cat build/test-cluster.log; \
	  ( $(call TIER,tests/gpu,gpu) ) || rc=1; \
	  exit $$rc
else
	@export $(REQUIRED); $(call PYTEST,$(PYTEST_ARGS))
endif

# The cluster tier as `make test` runs it, beside the docker tier once the unit tier has ended: its Slurm jobs set
# the topology of the sandbox they use, so it has sandboxes of its own (NAME-cluster, each with the test image),
# and the Swarm takes its image from there. They stay up as the others do (GPUPIN_SANDBOX_NAME=cluster make
# sandbox-down).
CLUSTER_SANDBOX_NAME = $(if $(GPUPIN_SANDBOX_NAME),$(GPUPIN_SANDBOX_NAME)-)cluster
.PHONY: cluster-beside
cluster-beside:
	@export $(REQUIRED); pids=; for e in $(DOCKER_ENGINES); do \
	  ( $(call UP_WITH_TEST_IMAGE,$$e) ) & pids="$$pids $$!"; \
	done; rc=0; for p in $$pids; do wait $$p || rc=1; done; [ $$rc = 0 ] || exit 1; \
	export GPUPIN_TEST_ENGINES="$(DOCKER_ENGINES)"; $(call TIER,tests/cluster,swarm or slurm)

test-unit: test-tools fakegpu
	@export $(SIMHOST); $(call TIER,tests/unit,$(UNIT),-n $(UNIT_WORKERS))

# The docker tier: each engine's run side by side (DOCKER_TIER).
test-docker: test-tools image-test
	@export $(REQUIRED); $(DOCKER_TIER)

# The Swarm's images come from the 20.10 sandbox.
test-cluster: ENGINES := $(filter-out podman,$(ENGINES))
test-cluster: test-tools image-test
	@export $(REQUIRED); $(call TIER,tests/cluster,swarm or slurm)

# The resident agent's soak at full length, 500 containers over 10 minutes on every engine at once (`make test` runs
# the same test for 90 s: tests/docker/test_serve_soak.py).
soak: test-tools image-test
	@export $(REQUIRED) GPUPIN_SOAK_SECONDS=600; $(call TIER,tests/docker/test_serve_soak.py,soak,-s)

# The hypothesis tests (hypothesis marks them) under the fuzz profile (tests/conftest.py): twenty times each test's
# examples, not derandomized.
fuzz: fakegpu
	@export $(SIMHOST); $(call TIER,tests/unit,hypothesis,--hypothesis-profile=fuzz)

# On a real NVIDIA host, with its own driver: none of the fakes on the library path.
test-gpu: setup
	@$(call TIER,tests/gpu,gpu)

# `hostagent ls` output as users see it is checked exactly against tests/golden; when a change of it is meant,
# this rewrites the files from the real CLI (on the simulated host and every engine's sandbox) for review
# with `git diff tests/golden`. The tests themselves never write them.
.PHONY: golden
# Every engine: the holders golden differs by the way hostagent pins there (--gpus, CDI). The docker tier's first:
# the unit tier's check that every golden file is for a shipped scenario or engine reads what it wrote.
golden: ENGINES := $(filter-out podman,$(ENGINES))
golden: test-tools image-test
	@export $(REQUIRED); \
	  $(call PYTEST,tests/docker/test_hostagent_ls.py tests/unit/test_hostagent_ls.py -k golden --update-golden -q)

# README.md's examples, rewritten from runs on the simulated host and the Docker 20.10 sandbox
# (tests/support/readme.py); tests/unit/test_readme.py and tests/docker/test_readme.py check them. Review with
# `git diff README.md`.
.PHONY: readme
readme: ENGINES := 20.10
readme: image-test
	@$(SIMHOST) $(VPY) -m tests.support.readme

# mypy reads the packages through a link tree named as they are imported (gpupin.core, .entrypoint, .hostagent).
# Every commit after SUBJECTS_SINCE has a subject of at most 72 characters (.ci/commit_msg.py --since; the
# commit-msg hook checks each as it is made). The commits before it are history, never rewritten: some are over,
# two of them (456b6d3, ab377d5) merged after 00f6b3b, the base first chosen, and before this check.
SUBJECTS_SINCE := ee1f012
.PHONY: commit-subjects
commit-subjects:
	@$(PY) .ci/commit_msg.py --since $(SUBJECTS_SINCE)

lint: setup
	@mkdir -p build/typing/gpupin && for p in core entrypoint hostagent; do ln -sfn ../../../$$p build/typing/gpupin/$$p; done
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VPY) -m mypy

# Measured as users get it: gpupin installed from its wheel (bytecode compiled, no editable-install finder) in a
# venv of its own; the figures land in build/bench/results.json too.
BENCH_VENV := build/bench-venv
# The demo runs on the default engine only; the benchmark's docker parts on every engine in ENGINES, side by side.
demo: ENGINES := 20.10
# --upgrade-deps: today's pip, as a user's venv gets it; Python 3.11's bundled pip 23.2 writes console scripts
# that import `re` (about 9 ms of every command's start-up, which `hostagent run` otherwise no longer pays).
BENCH_INSTALL = rm -rf $(BENCH_VENV) && $(PY) -m venv --upgrade-deps $(BENCH_VENV) && \
	$(BENCH_VENV)/bin/pip install -q --find-links build/wheels "$$(ls build/wheels/gpupin-*.whl)[host]"
# ENGINES=podman: the sandboxed podman service's (PODMAN=5: podman 5's), started here as podman-up starts it.
bench: image-test $(if $(filter podman,$(ENGINES)),podman-up)
	$(BENCH_INSTALL)
	$(SIMHOST) $(BENCH_VENV)/bin/python bench/run.py --json build/bench/results.json --engines "$(ENGINES)" $(BENCH_ARGS)

# What the authorization plugin adds to a `docker run` (bench/authz_bench.py): the plugin on and off in alternating
# blocks on each engine's sandbox, a container that reaches no card and one that pins a free card.
.PHONY: bench-authz
bench-authz: image-test
	$(SIMHOST) $(VPY) bench/authz_bench.py --json build/bench/authz.json --engines "$(filter-out podman,$(ENGINES))" $(BENCH_ARGS)

# `hostagent ls --swarm` against `docker node ls` + `docker service ps`, on the three-node swarm (started here, left
# running: make swarm-down stops it); hostagent talks to the manager, whose cards (mixed-4) its NVML sees.
.PHONY: bench-swarm
SWARM_MANAGER := unix:///run/gpupin-swarm$(if $(GPUPIN_SANDBOX_NAME),-$(GPUPIN_SANDBOX_NAME))/manager/docker.sock
bench-swarm: ENGINES := 20.10
bench-swarm: swarm-up
	$(BENCH_INSTALL)
	$(SIMHOST) DOCKER_HOST=$(SWARM_MANAGER) $(BENCH_VENV)/bin/python bench/run.py --json build/bench/swarm.json \
	  swarm $(BENCH_ARGS)

demo: image-test
	@$(SIMHOST) tests/sandbox/demo.sh
	@echo "Now try it yourself: make shell (a shell on the simulated host), or in your own shell:"
	@echo '  export $(SIMHOST) PATH="$(CURDIR)/$(VENV)/bin:$$PATH"'

# A shell on the simulated host, for your own commands (the demo's sandboxed 20.10 daemon, the fake cards, the
# checkout's hostagent on PATH); `exit` leaves it, `make sandbox-down` stops the daemon.
shell: sandbox-up
	@$(SIMHOST) tests/sandbox/shell.sh

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache
