#!/usr/bin/env bash
# Build the real local control plane used by the integration tests and `make cluster-up`:
#   kube-apiserver, kube-controller-manager, kubectl (k8s.io/kubernetes), etcd (go.etcd.io/etcd/server/v3)
#   and helm (helm.sh/helm/v4), all from the Go module proxy, pinned by the go.mod/go.sum files
#   committed under hack/controlplane/{kubernetes,etcd,helm}.
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/controlplane-<k8s version>/bin/
# Idempotent: when every binary is already there it exits 0 at once. Build logs go to
# .../controlplane-<version>/logs/. Exits non-zero on any failure.
#
# k8s.io/kubernetes pins its staging modules (k8s.io/api, k8s.io/client-go, ...) to v0.0.0 with
# local replaces, so hack/controlplane/kubernetes/go.mod replaces each with k8s.io/<m> v0.36.N.
# To bump: edit the versions below, then in each module dir run `go get -tool <pkg>@<v>` (and
# for kubernetes re-run the replace loop) and `go mod tidy`.
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
HELM_VERSION=v4.3.2

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
root="$cache/controlplane-$K8S_VERSION"
bin="$root/bin"
logs="$root/logs"
bins=(kube-apiserver kube-controller-manager kubectl etcd helm)

have_all() {
  local b
  for b in "${bins[@]}"; do [ -x "$bin/$b" ] || return 1; done
  # A marker written only after every build succeeded, so a half-finished build is redone.
  [ -f "$root/versions" ] && [ "$(cat "$root/versions")" = "$K8S_VERSION $ETCD_VERSION $HELM_VERSION" ]
}

if have_all; then
  echo "control plane: reusing $bin (kubernetes $K8S_VERSION, etcd $ETCD_VERSION, helm $HELM_VERSION)"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "control plane: 'go' not found (need Go >= 1.26 on PATH or at /usr/local/go/bin/go)" >&2
    exit 1
  fi
fi

mkdir -p "$bin" "$logs"
export CGO_ENABLED=0
export GOFLAGS="-trimpath -mod=readonly"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
ldflags="-s -w"

start=$(date +%s)
echo "control plane: building into $bin with $(go version) (logs in $logs)"

# build <module dir> <output name> <package> [extra ldflags]
build() {
  local dir="$1" out="$2" pkg="$3" extra="${4:-}" stamp="${5:-}"
  local t0 t1 log="$logs/$out.log"
  # The stamp names the package, its version and the exact pins, so a changed go.mod/go.sum rebuilds.
  stamp="$stamp $(cat "$here/controlplane/$dir/go.mod" "$here/controlplane/$dir/go.sum" | sha256sum | cut -c1-16)"
  if [ -x "$bin/$out" ] && [ -f "$bin/.$out.ok" ] && [ "$(cat "$bin/.$out.ok")" = "$pkg $stamp" ]; then
    echo "  $out: already built"
    return 0
  fi
  t0=$(date +%s)
  echo "  $out: go build $pkg (log: $log)"
  if ! (cd "$here/controlplane/$dir" && go build -v -ldflags "$ldflags $extra" -o "$bin/$out.tmp" "$pkg") >"$log" 2>&1; then
    echo "control plane: building $out failed; last lines of $log:" >&2
    tail -n 40 "$log" >&2
    rm -f "$bin/$out.tmp"
    exit 1
  fi
  mv -f "$bin/$out.tmp" "$bin/$out"
  echo "$pkg $stamp" >"$bin/.$out.ok"
  t1=$(date +%s)
  echo "  $out: done in $((t1 - t0)) s"
}

# Version stamps so `kube-apiserver --version` and /version report the real version.
kv="k8s.io/component-base/version"
kx="-X $kv.gitVersion=$K8S_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $kv.gitTreeState=clean -X $kv.buildDate=1970-01-01T00:00:00Z"
kxv="-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"

build etcd etcd go.etcd.io/etcd/server/v3 "" "$ETCD_VERSION"
build kubernetes kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kx $kxv" "$K8S_VERSION"
build kubernetes kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kx $kxv" "$K8S_VERSION"
build kubernetes kubectl k8s.io/kubernetes/cmd/kubectl "$kx $kxv" "$K8S_VERSION"
build helm helm helm.sh/helm/v4/cmd/helm "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" "$HELM_VERSION"

echo "$K8S_VERSION $ETCD_VERSION $HELM_VERSION" >"$root/versions"
end=$(date +%s)
echo "control plane: built in $((end - start)) s -> $bin"
"$bin/kube-apiserver" --version
# sed -n 1p reads everything: head -1 closes the pipe early, and the writer's SIGPIPE fails the
# script (exit 141 under pipefail) after a whole successful build.
"$bin/kubectl" version --client | sed -n 1p
"$bin/etcd" --version | sed -n 1p
"$bin/helm" version --short
