# lookahead-rollout. Two commands matter on a fresh machine: `make demo` and `make test`.
PY ?= python3
# Python never puts the working directory on sys.path here (3.11's -P): this repository's
# operator/ directory would shadow the standard library's `operator` module for every
# `python3 -m ...` run from the root (pip, pytest, runpy itself) in a virtualenv whose startup
# has not imported it already. The packages are installed (pip install -e .), so nothing relies
# on the working directory being importable.
export PYTHONSAFEPATH := 1
export LOOKAHEAD_CACHE ?= $(HOME)/.cache/lookahead-rollout

.PHONY: lint-imports deps deps-python deps-system control-plane engines-venv node registry images prometheus prometheus-operator gateway-crds test test-unit demo crds cluster-up cluster-down \
        bench-engine bench-decision bench-operator lint-chart soak

deps: deps-system deps-python control-plane engines-venv node registry images prometheus prometheus-operator gateway-crds

deps-system:
	bash hack/install-system-deps.sh

deps-python:
	bash hack/install-python-deps.sh

control-plane:
	bash hack/build-control-plane.sh

# vLLM and SGLang in an isolated venv, for the conformance tests against their own parsers
engines-venv:
	bash hack/install-engine-venv.sh

# a real node (kubelet, kube-scheduler, kube-proxy, CoreDNS, containerd, CNI) and the images it
# runs (docs/node.md); after deps-system: its `apt-get download` must not race apt-get's lock
node: deps-system control-plane
	bash hack/build-node.sh

# the OCI registry the local node pulls from, and crane, the client that pushes to it (docs/node.md)
registry:
	bash hack/build-registry.sh

# the three images as OCI archives; with REGISTRY=host[/path] (and TAG=, default the version) also
# pushed there with the chart (hack/push-images.sh; README, "Install on a cluster")
images: deps-system deps-python registry
	bash hack/build-images.sh
	$(if $(REGISTRY),bash hack/push-images.sh "$(REGISTRY)" "$(TAG)")

# Prometheus with Kubernetes pod discovery (Debian's is built without it), for Pods on the real node
prometheus: deps-system
	bash hack/build-prometheus.sh

# The Prometheus Operator (operator, prometheus-config-reloader, its CRDs), from its Go module, for
# tests/integration/test_prometheus_operator.py (our PodMonitors under a kube-prometheus-stack selector)
prometheus-operator: deps-system
	bash hack/build-prometheus-operator.sh

# Gateway API's HTTPRoute CRD and the Inference Extension's InferencePool CRD, from the Go module
# proxy, for the tests of live mode's split gatewayAPI (tests/integration/test_live_gateway.py)
gateway-crds:
	bash hack/fetch-gateway-crds.sh

crds:
	$(PY) -m lookahead_dev.crdgen

# The builds first, four at a time: the Go builds keep both cores busy while the downloads (apt,
# pip, the engines' venv, the images' wheels) wait on the network beside them; each output line is
# whole (-Oline). Then two workers: every test on the one real node runs in one of them, in order
# (tests/conftest.py groups them; the scenarios of one e2e module run at the same time on it:
# tests/e2e/together.py), and everything else beside it in the other (pytest-xdist, --dist
# loadgroup). The slowest 25 are listed at the end, where the time goes.
test:
	$(MAKE) --no-print-directory -j4 -Oline deps
	$(PY) -m pytest -q -ra -n 2 --dist loadgroup --durations=25

# the layer rules of docs/architecture.md (also checked inside `make test`: tests/unit/test_layers.py)
lint-imports: deps-python
	lint-imports --no-cache

test-unit: deps-python
	$(PY) -m pytest -q tests/unit

demo: deps-python
	kubectl-lookahead analyze

# the fault soak (issue 12): ten policies for 15 minutes under seeded operator, Prometheus and
# engine Pod kills, on the real node (about 17 minutes; not part of `make test`)
soak: deps
	$(PY) -m pytest -q -ra tests/e2e/soak.py

cluster-up: deps
	$(PY) -m lookahead_dev.devcluster up

cluster-down:
	$(PY) -m lookahead_dev.devcluster down

bench-engine: deps-python
	$(PY) -m lookahead_dev.bench_engine

bench-decision: deps-python
	$(PY) -m lookahead_dev.bench_decision

bench-operator: deps
	$(PY) -m lookahead_dev.bench_operator
