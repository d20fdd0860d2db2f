#!/usr/bin/env bash
# Build the Prometheus server the dev cluster and the tests run (lookahead_dev.devcluster), from
# the Go module proxy, WITH Kubernetes service discovery (`kubernetes_sd_configs`), which Debian's
# `prometheus` package (2.42) leaves out.
#
#   prometheus   github.com/prometheus/prometheus/cmd/prometheus $PROM_MODULE (= Prometheus
#                $PROM_VERSION: Prometheus 3.x is tagged v0.3MM.P as a Go module), built with
#                `go install pkg@version`: the module has no replace directives, so its own go.mod
#                and go.sum (checked against sum.golang.org) pin every dependency; nothing to commit.
#
# Build tags: remove_all_sd,enable_kubernetes_sd (plugins/ in the module): every optional service
# discovery is left out except Kubernetes; file_sd, static_configs and http_sd are core and stay.
# No `builtinassets`: the web UI is not embedded (the HTTP API, /-/ready and /-/reload work; the
# UI pages answer 404/500). promtool is not built.
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/prometheus-$PROM_VERSION/
#   bin/prometheus
#   logs/prometheus.log   the build log
#   versions              written last, only when the build succeeded (a half-finished build is redone)
# Idempotent: when the stamp matches it exits 0 at once. Exits non-zero on any failure.
# To bump: set PROM_MODULE and PROM_VERSION below (`go list -m -versions github.com/prometheus/prometheus`);
# the script checks that the module's VERSION file says PROM_VERSION.
set -euo pipefail

PROM_MODULE=v0.316.0
PROM_VERSION=v3.16.0
TAGS=remove_all_sd,enable_kubernetes_sd

cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
root="$cache/prometheus-$PROM_VERSION"
bin="$root/bin"
logs="$root/logs"
pkg=github.com/prometheus/prometheus/cmd/prometheus
stamp="prometheus $PROM_VERSION module=$PROM_MODULE tags=$TAGS"

if [ -x "$bin/prometheus" ] && [ -f "$root/versions" ] && [ "$(cat "$root/versions")" = "$stamp" ]; then
  echo "prometheus: reusing $bin/prometheus ($PROM_VERSION, tags $TAGS)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "prometheus: 'go' not found (need Go >= 1.26.7 on PATH or at /usr/local/go/bin/go)" >&2
    exit 1
  fi
fi

mkdir -p "$bin" "$logs"
rm -f "$root/versions"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
log="$logs/prometheus.log"
start=$(date +%s)
echo "prometheus: building $pkg@$PROM_MODULE into $bin with $(go version) (log: $log)"

fail() {
  echo "prometheus: $1; last lines of $log:" >&2
  tail -n 40 "$log" >&2
  exit 1
}

# `go install pkg@version` ignores any go.mod around it; run it outside the repository anyway.
cd "$root"
dir="$(go mod download -json "github.com/prometheus/prometheus@$PROM_MODULE" 2>"$log" \
  | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')" || true
[ -n "$dir" ] && [ -f "$dir/VERSION" ] || fail "go mod download github.com/prometheus/prometheus@$PROM_MODULE failed"
if [ "v$(cat "$dir/VERSION")" != "$PROM_VERSION" ]; then
  echo "prometheus: module $PROM_MODULE is Prometheus $(cat "$dir/VERSION"), not $PROM_VERSION" >&2
  exit 1
fi

v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=${PROM_VERSION#v} -X $v.Revision=$PROM_MODULE -X $v.Branch=HEAD -X $v.BuildUser=lookahead-rollout -X $v.BuildDate=19700101-00:00:00"
rm -rf "$root/gobin"
# nice: this takes minutes of every core; leave the machine usable meanwhile.
if ! GOBIN="$root/gobin" GOFLAGS=-trimpath nice -n 10 go install -v -tags "$TAGS" -ldflags "$ldflags" \
    "$pkg@$PROM_MODULE" >>"$log" 2>&1; then
  rm -rf "$root/gobin"
  fail "building prometheus failed"
fi
mv -f "$root/gobin/prometheus" "$bin/prometheus"
rm -rf "$root/gobin"

echo "$stamp" >"$root/versions"
echo "prometheus: built in $(($(date +%s) - start)) s -> $bin/prometheus"
# sed -n 1p reads everything: head -1 would close the pipe early, and the writer's SIGPIPE would
# fail the script (exit 141 under pipefail) after a whole successful build.
"$bin/prometheus" --version 2>&1 | sed -n 1p
