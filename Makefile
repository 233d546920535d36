# dmlbench: every target sets itself up (creates .venv, installs pinned dependencies).
#   make repro   run the DVC pipeline on params.yaml (the offline demo by default)
#   make plan    what `make repro` would cost, before anything runs: stages by kind, device-hours, wall
#                time, memory, disk (same PRESET/GPUS/GPU_SLOTS/JOBS/EXECUTOR/DEVICE; docs/pipeline.md)
#   make test    run the test suite
#   make ui      MLflow UI on http://127.0.0.1:$(PORT) over the project's tracking store (prints the
#                address of the runs table)
#   make gpu-check   the GPU path checked and measured (CUDA tests, throughput, eval speed, a
#                real-size run) with the Python that already holds a CUDA torch: no venv
#                (GPU_PYTHON=python3 by default); table + reports/gpu_check.json
# make repro runs independent stages in parallel (JOBS=n, default: CPU cores; JOBS=1 is a
# plain sequential `dvc repro`). On a GPU box: make repro EXTRAS=gpu,test GPUS=0,1,2,3 (GPU_SLOTS=4: four
# small trainings per GPU; MPS=1: side by side under CUDA MPS)
# torch's CUDA build per GPU generation and driver (docs/gpu.md): TORCH_BACKEND=cu126 (V100/P100,
# or a driver 525-579), cpu; default: the locked CUDA 13.0 build. The venv remembers it.
# A protocol with device: cuda refuses to start without a usable GPU; DEVICE=cpu runs it on the CPU.
# A published setup: make repro PRESET=thesis-cub GPUS=0,1 runs presets/thesis-cub.yaml in its own
# workspace, artifacts/presets/thesis-cub/ (docs/presets.md); params.yaml stays the demo.
# On Slurm: make repro EXECUTOR=slurm submits one job per stale stage (afterok dependencies; the
# cluster: section of params.yaml; README "Running on a cluster"); DETACH=1 returns after
# submitting, ATTACH=1 takes an earlier run's jobs over (so does a plain re-run; docs/cluster.md).
# A local cluster (docs/cluster.md; as root, installs Debian packages):
#   make cluster-up    single-node Slurm (sacct through slurmdbd) + PostgreSQL on 127.0.0.1, under .cluster/
#   make server        the team MLflow server on it (PostgreSQL store, basic-auth) on http://127.0.0.1:5001;
#                      no root and no local cluster: make server DATABASE_URL=postgresql://user@host/db
# make fetch (PRESET=...): download and verify every archive and weights file the grid needs, here
#   (a cluster's login node), so that no Slurm job needs the internet (docs/cluster.md)
#   make cluster-down  stops what those two started; then: source .cluster/env to use it from a shell
# Share a grid (docs/extending.md, "Compare your loss with a published grid"):
#   make publish REMOTE=<dvc remote name, folder or URL>   dvc push of the grid's outputs (a folder or URL
#                becomes the default remote in .dvc/config: commit it with dvc.lock); prepared caches only
#                of datasets whose terms allow it (docs/datasets.md)
#   make pull (REMOTE=...)   in a clone of that commit: dvc pull; every pulled stage is up to date

SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= cpu,test
PORT ?= 5000
comma := ,
BIN := $(VENV)/bin
TORCH_BACKEND ?= $(shell cat $(VENV)/.torch-backend 2>/dev/null)# the venv's, else the locked build
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))$(if $(filter-out cu130,$(TORCH_BACKEND)),-$(TORCH_BACKEND))

export MLFLOW_TRACKING_URI ?= sqlite:///$(CURDIR)/mlflow.db
export MLFLOW_DISABLE_TELEMETRY := true
export MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT := true
export DVC_NO_ANALYTICS := 1
ORIGINAL_PATH := $(subst $(CURDIR)/$(BIN):,,$(PATH))# without the venv, also when make runs inside make test
GPU_PYTHON ?= python3
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup repro plan test ui status clean-venv gpu-check example-report cluster-up cluster-down server fetch publish pull

setup: $(STAMP)

$(STAMP): pyproject.toml requirements.lock
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "dmlbench needs Python >= 3.11; run: make PYTHON=python3.11 ...")'
	@echo "Setting up $(VENV) with the pinned dependencies ($(EXTRAS)); the first time takes a minute or two."
	@# uv installs (pip's settings passed on; pip if uv fails), then the modules a run imports are
	@# byte-compiled once: tools/setup_venv.py
	@$(PYTHON) tools/setup_venv.py --venv $(VENV) --extras $(EXTRAS) $(if $(TORCH_BACKEND),--torch-backend $(TORCH_BACKEND))
	@rm -f $(VENV)/.installed-*
	@touch $@

repro: $(STAMP)
	python -m dmlbench.pipeline $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(PRESET),--preset $(PRESET)) $(if $(JOBS),--jobs $(JOBS)) $(if $(GPUS),--gpus $(GPUS)) $(if $(GPU_SLOTS),--gpu-slots $(GPU_SLOTS)) $(if $(filter 1 yes true,$(MPS)),--mps) $(if $(DEVICE),--device $(DEVICE)) $(if $(filter 1 yes true,$(ATTACH)),--attach) $(if $(filter 1 yes true,$(DETACH)),--detach)

plan: $(STAMP)
	@python -m dmlbench.pipeline --plan $(if $(EXECUTOR),--executor $(EXECUTOR)) $(if $(PRESET),--preset $(PRESET)) $(if $(JOBS),--jobs $(JOBS)) $(if $(GPUS),--gpus $(GPUS)) $(if $(GPU_SLOTS),--gpu-slots $(GPU_SLOTS)) $(if $(DEVICE),--device $(DEVICE))

fetch: $(STAMP)
	python -m dmlbench.pipeline --fetch-only $(if $(PRESET),--preset $(PRESET))

publish: $(STAMP)
	python -m dmlbench.pipeline.publish push $(REMOTE)

pull: $(STAMP)
	python -m dmlbench.pipeline.publish pull $(REMOTE)

test: $(STAMP)
	$(BIN)/python -m pytest

ui: $(STAMP)
	python -m dmlbench.tracking.ui --host 127.0.0.1 --port $(PORT)

# docs/example-report/: the demo's report as `make repro` wrote it (run after a full demo run; commit it)
example-report: repro
	rm -rf docs/example-report && mkdir -p docs/example-report
	cp -r reports/report.md reports/figures docs/example-report/

gpu-check:
	PATH="$(ORIGINAL_PATH)" PYTHONPATH="$(CURDIR)/src$${PYTHONPATH:+:$$PYTHONPATH}" $(GPU_PYTHON) benchmarks/gpu_check.py $(ARGS)

cluster-up:
	@cluster/up.sh

cluster-down:
	@cluster/down.sh

# the cluster extra of pyproject.toml (PostgreSQL driver, basic-auth's Flask-WTF) on top of EXTRAS,
# without reinstalling dmlbench itself
CLUSTER_STAMP := $(VENV)/.installed-cluster-extra
$(CLUSTER_STAMP): $(STAMP)
	@$(BIN)/python -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["cluster"], sep="\n")' \
		| $(BIN)/python -m pip install --disable-pip-version-check --quiet -c requirements.lock -r /dev/stdin
	@touch $@

server: $(CLUSTER_STAMP)
	@MLFLOW_BIN=$(CURDIR)/$(BIN)/mlflow $(if $(DATABASE_URL),DMLBENCH_DATABASE_URL='$(DATABASE_URL)') cluster/server.sh

status: $(STAMP)
	dvc status
	dvc metrics show

clean-venv:
	rm -rf $(VENV)
