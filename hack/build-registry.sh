#!/usr/bin/env bash
# Build the OCI registry the local cluster pulls its images from, and the client that pushes them
# (issue 24: images come from a registry, as on any cluster), from the Go module proxy:
#
#   registry   github.com/distribution/distribution/v3/cmd/registry $DISTRIBUTION_VERSION
#              (CNCF distribution: the registry Docker Hub, GHCR and Harbor grew from)
#   crane      github.com/google/go-containerregistry/cmd/crane $CRANE_VERSION
#              (pushes the OCI archives hack/build-images.sh makes; `make images REGISTRY=...`)
#
# Both with `go install pkg@version`: their own go.mod and go.sum (checked against
# sum.golang.org) pin every dependency; nothing to commit. lookahead_dev.registry runs them.
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/registry-$DISTRIBUTION_VERSION/
#   bin/registry, bin/crane
#   logs/build.log        the build log
#   versions              written last, only when both built (a half-finished build is redone)
# Idempotent: when the stamp matches it exits 0 at once. Exits non-zero on any failure.
set -euo pipefail

DISTRIBUTION_VERSION=v3.1.2   # keep in step with lookahead_dev.registry.REGISTRY_VERSION
CRANE_VERSION=v0.22.1

cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
root="$cache/registry-$DISTRIBUTION_VERSION"
bin="$root/bin"
logs="$root/logs"
stamp="registry distribution=$DISTRIBUTION_VERSION crane=$CRANE_VERSION"

if [ -x "$bin/registry" ] && [ -x "$bin/crane" ] && [ -f "$root/versions" ] && [ "$(cat "$root/versions")" = "$stamp" ]; then
  echo "registry: reusing $bin (distribution $DISTRIBUTION_VERSION, crane $CRANE_VERSION)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "registry: 'go' not found (need Go >= 1.25 on PATH or at /usr/local/go/bin/go)" >&2
    exit 1
  fi
fi

mkdir -p "$bin" "$logs"
rm -f "$root/versions"
export CGO_ENABLED=0 GOBIN="$bin"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
log="$logs/build.log"
start=$(date +%s)
: >"$log"
cd "$root"   # `go install pkg@version` ignores any go.mod around it; run it outside the repository anyway
for pkg in "github.com/distribution/distribution/v3/cmd/registry@$DISTRIBUTION_VERSION" \
           "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"; do
  echo "registry: go install $pkg (log: $log)"
  if ! go install -trimpath -ldflags=-s "$pkg" >>"$log" 2>&1; then
    echo "registry: go install $pkg failed; last lines of $log:" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
done
"$bin/registry" --version >>"$log" 2>&1
"$bin/crane" version >>"$log" 2>&1
echo "$stamp" >"$root/versions"
echo "registry: built $bin/registry and $bin/crane in $(($(date +%s) - start)) s"
