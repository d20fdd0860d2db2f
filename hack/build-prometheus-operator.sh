#!/usr/bin/env bash
# Build the Prometheus Operator the tests run (tests/integration/test_prometheus_operator.py: our
# PodMonitors against a kube-prometheus-stack-like `podMonitorSelector`), from the Go module proxy.
#
#   operator                       github.com/prometheus-operator/prometheus-operator/cmd/operator
#   prometheus-config-reloader     .../cmd/prometheus-config-reloader
#   crds/*.yaml                    the module's example/prometheus-operator-crd/ (the CRDs the
#                                  operator's own bundle.yaml installs; apply with --server-side:
#                                  the Prometheus CRD is too large for the last-applied annotation)
#
# Unlike Prometheus (hack/build-prometheus.sh), `go install pkg@version` cannot build it: its go.mod
# replaces its two nested modules (pkg/apis/monitoring, pkg/client) with directories, and the Go
# module zip leaves nested modules out. So the module source is copied to a writable tree, the two
# nested modules at the same version are copied into place from the proxy, and `go build` runs
# there with -mod=readonly: the module's own go.mod and go.sum (checked against sum.golang.org)
# pin every dependency; nothing to commit.
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/prometheus-operator-$PO_VERSION/
#   bin/operator, bin/prometheus-config-reloader   static (CGO_ENABLED=0)
#   crds/monitoring.coreos.com_*.yaml
#   logs/build.log        the build log
#   versions              written last, only when the build succeeded (a half-finished build is redone)
# Idempotent: when the stamp matches it exits 0 at once. Exits non-zero on any failure.
# To bump: set PO_VERSION below (`go list -m -versions github.com/prometheus-operator/prometheus-operator`);
# the script checks that the module's VERSION file says it.
set -euo pipefail

PO_VERSION=v0.85.0
MODULE=github.com/prometheus-operator/prometheus-operator
NESTED="pkg/apis/monitoring pkg/client"
BINARIES="operator prometheus-config-reloader"

cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
root="$cache/prometheus-operator-$PO_VERSION"
bin="$root/bin"
crds="$root/crds"
logs="$root/logs"
stamp="prometheus-operator $PO_VERSION binaries=$BINARIES crds=example/prometheus-operator-crd"

if [ -f "$root/versions" ] && [ "$(cat "$root/versions")" = "$stamp" ] \
    && [ -x "$bin/operator" ] && [ -x "$bin/prometheus-config-reloader" ] \
    && [ -f "$crds/monitoring.coreos.com_podmonitors.yaml" ]; then
  echo "prometheus-operator: reusing $bin ($PO_VERSION)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "prometheus-operator: 'go' not found (need Go on PATH or at /usr/local/go/bin/go)" >&2
    exit 1
  fi
fi

mkdir -p "$bin" "$logs"
rm -f "$root/versions"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
log="$logs/build.log"
: >"$log"
start=$(date +%s)
echo "prometheus-operator: building $MODULE@$PO_VERSION into $bin with $(go version) (log: $log)"

fail() {
  echo "prometheus-operator: $1; last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
}

# The module directory of MODULE_PATH@PO_VERSION in the module cache (downloaded if missing).
module_dir() {
  go mod download -json "$1@$PO_VERSION" 2>>"$log" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p' || true
}

cd "$root"
dir="$(module_dir "$MODULE")"
[ -n "$dir" ] && [ -f "$dir/VERSION" ] || fail "go mod download $MODULE@$PO_VERSION failed"
if [ "v$(cat "$dir/VERSION")" != "$PO_VERSION" ]; then
  echo "prometheus-operator: module $PO_VERSION says VERSION $(cat "$dir/VERSION")" >&2
  exit 1
fi

# A writable copy of the source (the module cache is read-only), the nested modules put in place.
src="$root/src"
rm -rf "$src"
cp -r "$dir" "$src"
chmod -R u+w "$src"
for sub in $NESTED; do
  subdir="$(module_dir "$MODULE/$sub")"
  [ -n "$subdir" ] && [ -f "$subdir/go.mod" ] || fail "go mod download $MODULE/$sub@$PO_VERSION failed"
  rm -rf "${src:?}/$sub"
  mkdir -p "$(dirname "$src/$sub")"
  cp -r "$subdir" "$src/$sub"
  chmod -R u+w "$src/$sub"
done

# The CRDs: example/prometheus-operator-crd/ (what bundle.yaml carries); -full/ adds only
# descriptions' extras. Checked to hold the two this project uses.
crdsrc="$src/example/prometheus-operator-crd"
[ -f "$crdsrc/monitoring.coreos.com_podmonitors.yaml" ] && [ -f "$crdsrc/monitoring.coreos.com_prometheuses.yaml" ] \
  || fail "no PodMonitor/Prometheus CRD under $crdsrc"
rm -rf "$crds"
mkdir -p "$crds"
cp "$crdsrc"/monitoring.coreos.com_*.yaml "$crds/"

# The same version stamp upstream's Makefile sets (GO_BUILD_LDFLAGS), fixed for reproducibility.
v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=${PO_VERSION#v} -X $v.Revision=$PO_VERSION -X $v.Branch=HEAD -X $v.BuildUser=lookahead-rollout -X $v.BuildDate=19700101-00:00:00"
cd "$src"
for b in $BINARIES; do
  echo "prometheus-operator: go build ./cmd/$b" >>"$log"
  # nice: this takes minutes of every core; leave the machine usable meanwhile.
  if ! GOFLAGS="-trimpath -buildvcs=false -mod=readonly" nice -n 10 go build -v -ldflags "$ldflags" \
      -o "$root/$b.new" "./cmd/$b" >>"$log" 2>&1; then
    rm -f "$root/$b.new"
    fail "building $b failed"
  fi
  mv -f "$root/$b.new" "$bin/$b"
done
cd "$root"
rm -rf "$src"

echo "$stamp" >"$root/versions"
echo "prometheus-operator: built in $(($(date +%s) - start)) s -> $bin (crds: $crds)"
# sed -n 1p reads everything (head -1 would SIGPIPE the writer and fail under pipefail).
"$bin/operator" --version 2>&1 | sed -n 1p
