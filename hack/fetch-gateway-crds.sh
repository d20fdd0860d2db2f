#!/usr/bin/env bash
# The Gateway API's standard-channel HTTPRoute CRD and the Inference Extension's InferencePool CRD
# (inference.networking.k8s.io/v1), which the integration tests of live mode's `split: gatewayAPI`
# install on the local apiserver. Fetched from the Go module proxy (the only network this needs):
# `go mod download` of each module at a pinned version, its checksum checked against sum.golang.org
# as for any Go module; the two YAML files copied out. Idempotent: nothing is fetched again once
# both are there.
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/gateway-crds-<gateway-api>-<inference-extension>/
#         httproutes.yaml, inferencepools.yaml
set -euo pipefail
GATEWAY_API_VERSION=${GATEWAY_API_VERSION:-v1.6.3}
INFERENCE_EXTENSION_VERSION=${INFERENCE_EXTENSION_VERSION:-v1.6.2}
cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
out="$cache/gateway-crds-$GATEWAY_API_VERSION-$INFERENCE_EXTENSION_VERSION"
if [ -s "$out/httproutes.yaml" ] && [ -s "$out/inferencepools.yaml" ]; then
    exit 0
fi
command -v go >/dev/null || { echo "fetch-gateway-crds: go is needed (the CRDs come from the Go module proxy)" >&2; exit 1; }
mkdir -p "$cache"
tmp=$(mktemp -d "$cache/.gateway-crds.XXXXXX")
trap 'chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
export GOMODCACHE="$tmp/gomod" GOFLAGS=-modcacherw GOTOOLCHAIN=local GO111MODULE=on

module_dir() {  # the extracted module's directory, from `go mod download -json`
    (cd "$tmp" && timeout 600 go mod download -json "$1") | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

gw=$(module_dir "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION")
ie=$(module_dir "sigs.k8s.io/gateway-api-inference-extension@$INFERENCE_EXTENSION_VERSION")
mkdir -p "$tmp/out"
cp "$gw/config/crd/standard/gateway.networking.k8s.io_httproutes.yaml" "$tmp/out/httproutes.yaml"
cp "$ie/config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" "$tmp/out/inferencepools.yaml"
# (another run may have finished first: its copy is the same files)
mv -T "$tmp/out" "$out" 2>/dev/null || [ -s "$out/inferencepools.yaml" ]
echo "gateway CRDs in $out"
