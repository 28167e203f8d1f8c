# The two commands of the README. Both work on a fresh clone: they create .venv themselves.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A simulated pool when the machine has no NVIDIA GPU (override: make demo SIMULATE=1xT4-16GB).
SIMULATE ?= $(shell nvidia-smi -L >/dev/null 2>&1 || echo 2xA100-80GB,1xT4-16GB)
# make demo PORT=8890 serves on another port (JupyterLab moves on to the next free one when it is
# taken); HEADLESS=1 opens no browser (a machine without a desktop, or over SSH: open the URL it
# prints, with its token).
PORT ?= 8888
HEADLESS ?=

.PHONY: demo test conformance install install-test lint bench bench-quick docs controlplane controlplane-newest deviceplugin kueue cluster cluster-newest test-newest images

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

install: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[lab]'

# Test dependencies, configurable-http-proxy from npm for the JupyterHub test, Debian's
# Chromium for the browser tests, and Debian's containerd, runc, CNI plugins and umoci for the
# test cluster's real node.
install-test: $(BIN)/python
	$(BIN)/pip install --quiet -e '.[lab,test,docs]'
	touch $(DOCS_STAMP)
	npm install --prefix build/node --no-audit --no-fund --silent configurable-http-proxy@4
	bash scripts/install-chromium.sh
	bash scripts/install-real-node.sh

demo: install
	$(BIN)/jupyter gpushare kernelspec install --sys-prefix
	JUPYTER_GPUSHARE_SIMULATE=$(SIMULATE) $(BIN)/jupyter lab --notebook-dir=examples --port=$(PORT) \
		$(if $(HEADLESS),--no-browser) $(if $(filter 0,$(shell id -u)),--allow-root)

lint: install-test labextension/node_modules
	$(BIN)/ruff check jupyter_gpushare tests benchmarks docs
	$(BIN)/ruff format --check jupyter_gpushare tests benchmarks docs
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache --no-logo
	cd labextension && npm run --silent lint

# The JupyterLab extension's npm packages (pip install builds with them; lint needs them too).
labextension/node_modules: labextension/package-lock.json
	cd labextension && npm install --no-audit --no-fund --silent
	touch $@

# The documentation site (docs/, MyST Markdown) into build/docs/html. Warnings are errors and
# references must resolve (-n), so a broken link or a reference the code no longer backs fails.
# -E: always a full build (the reference is generated from the code, which Sphinx does not watch).
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[docs]'
	touch $@

docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs build/docs/html
	@echo "The documentation: build/docs/html/index.html"

test: lint docs controlplane deviceplugin kueue images
	$(BIN)/pytest
	$(BIN)/python tests/conformance/run.py

# jupyter_server's and jupyter_client's own kernel tests, from the sdists of the installed
# versions (fetched into build/conformance once per version), with gpushare-provisioner as the
# default kernelspec's provisioner: a release that changes the kernel lifecycle fails here.
conformance: install-test
	$(BIN)/python tests/conformance/run.py

# The test cluster's control plane: Kubernetes' own kube-apiserver, kube-scheduler and
# kube-controller-manager in one Go program (tests/cluster/controlplane), which is also the real
# node's kubelet and kubectl, built once per version and source into build/cluster/bin. Needs Go;
# a cold build takes minutes (docs/development.md).
controlplane:
	$(PYTHON) tests/cluster/build.py --kubernetes oldest

# NVIDIA's device plugin (k8s-device-plugin, built unmodified from its Go module; cgo, so gcc too)
# and the tests' kubelet stub, into build/cluster/bin once per module files
# (tests/cluster/nvidia_device_plugin.py). It runs over the simulated NVML, tests/support/nvml_sim.
deviceplugin: $(BIN)/python
	$(BIN)/python -m tests.cluster.nvidia_device_plugin

# Kueue's controller manager (sigs.k8s.io/kueue's cmd/kueue, built unmodified from its Go module)
# into build/cluster/bin once per module files (tests/cluster/kueue.py); its CRDs, webhooks and
# ClusterRole come from the same module. `make cluster CLUSTER_ARGS="--kueue"` runs it.
kueue: $(BIN)/python
	$(BIN)/python -m tests.cluster.kueue

# The real node's kernel image (tests/cluster/images.py): examples/kubernetes/kernel-image's
# Dockerfile built with buildah on a Debian base made with debootstrap, kept in build/images by a
# hash of its inputs. Needs root; a cold build takes a few minutes (docs/development.md).
images: install-test
	bash scripts/install-image-tools.sh
	$(BIN)/python tests/cluster/images.py kernel

# The newest Kubernetes served (a newer Go toolchain, fetched by Go itself, where it needs one).
controlplane-newest:
	$(PYTHON) tests/cluster/build.py --kubernetes newest

# The test cluster in the foreground: four simulated 80 GiB GPU nodes and one real node (kubelet,
# containerd, runc; root), the admin's kubeconfig in build/cluster/kubeconfig; Ctrl-C stops it.
# Options: make cluster CLUSTER_ARGS="--nodes hami" (--no-real-node: the simulated ones only;
# --kueue: Kueue with a ClusterQueue and LocalQueue holding GPU quota, built first when missing).
cluster: $(BIN)/python controlplane
	$(BIN)/pip install --quiet -e '.[lab,cluster]'
	bash scripts/install-real-node.sh
	$(BIN)/python -m tests.cluster $(CLUSTER_ARGS)

cluster-newest: $(BIN)/python controlplane-newest
	$(BIN)/pip install --quiet -e '.[lab,cluster]'
	bash scripts/install-real-node.sh
	$(BIN)/python -m tests.cluster --kubernetes newest $(CLUSTER_ARGS)

# The cluster tests against the newest Kubernetes served.
test-newest: install-test controlplane-newest
	KUBE_TESTCLUSTER=$$($(PYTHON) tests/cluster/build.py --kubernetes newest) $(BIN)/pytest tests/integration/test_cluster.py tests/integration/test_kubernetes.py tests/integration/test_kubernetes_dra.py tests/integration/kubernetes_server tests/integration/test_broker_kubernetes.py tests/integration/test_broker_dra.py tests/integration/test_doctor_cluster.py

bench: install controlplane kueue
	$(BIN)/pip install --quiet -e '.[test,cluster,bench]'
	bash benchmarks/run_all.sh

# CI-sized benchmarks (each well under a minute; CI runs them after the tests): a benchmark that
# crashes fails, a missed goal is a verdict in the output (benchmarks/README.md).
bench-quick: $(BIN)/python controlplane kueue
	$(BIN)/pip install --quiet -e '.[test,cluster,bench]'
	bash benchmarks/run_all.sh --quick
