#!/usr/bin/env bash
# Build the pieces of a real local node (lookahead_dev.node.DevNode, docs/node.md):
#   kubelet, kube-scheduler, k8s.io/kubernetes $K8S_VERSION, with the SAME replace list and pins as
#   kube-proxy               the control plane (hack/controlplane/kubernetes/go.mod), from the Go
#                            module proxy
#   coredns                  github.com/coredns/coredns, the version and plugins of hack/coredns
#                            (go.mod, go.sum and main.go committed there: only the plugins the
#                            node's cluster DNS uses)
#   bridge, host-local,      github.com/containernetworking/plugins $CNI_VERSION (go install
#   loopback, portmap        pkg@version: that module has no replace directives)
#   containerd, ctr, runc    Debian's packages (apt-get download + dpkg-deb -x; no install, no service)
#   pause image              a 20-line static Go program, packed as an OCI archive (images/ocipack.py)
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/node-<k8s version>/
#   bin/        kubelet kube-scheduler kube-proxy coredns containerd containerd-shim-runc-v2 ctr runc pause
#   cni/        bridge host-local loopback portmap
#   images/pause.oci.tar
#   logs/       one log per build step
#   src/        the generated module dirs (see below)
#   versions    written last, only when everything succeeded (a half-finished build is redone)
# Idempotent: when the stamp matches it exits 0 at once. Exits non-zero on any failure.
#
# Why Debian's containerd 1.6 and runc 1.1 rather than containerd v2 from its Go module: they are
# prebuilt (seconds instead of ~3 more minutes of Go build on 2 cores), they are what the issue
# verified on this machine (cgroup v1, no CAP_SYS_RESOURCE), and CRI v1 is all the kubelet needs.
# CONTAINERD_FROM=go (unset by default) is not implemented here; see docs/node.md.
#
# kubelet, kube-scheduler and kube-proxy need modules that kube-apiserver/kubectl do not (cri-streaming, ...),
# so their go.sum entries are not in hack/controlplane/kubernetes/go.sum. Until that go.mod lists
# them as tools (regenerate: add `k8s.io/kubernetes/cmd/kubelet` and `.../kube-scheduler` to its
# tool block, `go mod tidy`; this script does exactly that into src/kubernetes and keeps the
# result in logs/kubernetes.go.{mod,sum} to commit), the script derives a module from the
# committed one: same module requirements and replaces, two more tools, `go mod tidy` (which only
# adds go.sum lines, checked against sum.golang.org through the proxy; it prints any version that
# moved, and fails if one did). Once the committed go.mod lists them, it builds there, read-only.
set -euo pipefail

K8S_VERSION=v1.36.3
CNI_VERSION=v1.9.1
PAUSE_IMAGE=localhost/lookahead-rollout/pause:3.10

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
root="$cache/node-$K8S_VERSION"
bin="$root/bin"
cni="$root/cni"
logs="$root/logs"
src="$root/src"
imgs="$root/images"
bins=(kubelet kube-scheduler kube-proxy coredns containerd containerd-shim-runc-v2 ctr runc pause)
cnis=(bridge host-local loopback portmap)

# What the finished build is made of; any change rebuilds what changed.
stamp_text() {
  echo "$K8S_VERSION cni=$CNI_VERSION pause=$PAUSE_IMAGE"
  cat "$here/controlplane/kubernetes/go.mod" "$here/controlplane/kubernetes/go.sum" "$repo/images/ocipack.py" \
    "$here/coredns/go.mod" "$here/coredns/go.sum" "$here/coredns/main.go" | sha256sum | cut -c1-16
}

have_all() {
  local b
  for b in "${bins[@]}"; do [ -x "$bin/$b" ] || return 1; done
  for b in "${cnis[@]}"; do [ -x "$cni/$b" ] || return 1; done
  [ -f "$imgs/pause.oci.tar" ] || return 1
  [ -f "$root/versions" ] && [ "$(sed -n 1,2p "$root/versions")" = "$(stamp_text)" ]
}

if have_all; then
  echo "node: reusing $root ($(sed -n 3p "$root/versions"))"
  exit 0
fi

if ! command -v go >/dev/null 2>&1; then
  if [ -x /usr/local/go/bin/go ]; then
    export PATH="/usr/local/go/bin:$PATH"
  else
    echo "node: 'go' not found (need Go >= 1.26 on PATH or at /usr/local/go/bin/go)" >&2
    exit 1
  fi
fi

mkdir -p "$bin" "$cni" "$logs" "$src" "$imgs"
export CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
ldflags="-s -w"
start=$(date +%s)
echo "node: building into $root with $(go version) (logs in $logs)"

fail() {  # fail <log> <message>
  echo "node: $2; last lines of $1:" >&2
  tail -n 40 "$1" >&2
  exit 1
}

# ---- kubelet, kube-scheduler and kube-proxy ---------------------------------------------------
kdir="$here/controlplane/kubernetes"
ktools=(k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kube-proxy)
listed=1
for t in "${ktools[@]}"; do grep -q "$t\$" "$kdir/go.mod" || grep -q "$t " "$kdir/go.mod" || listed=0; done
if [ $listed = 0 ]; then
  kdir="$src/kubernetes"
  want="$( (cat "$here/controlplane/kubernetes/go.mod" "$here/controlplane/kubernetes/go.sum"; echo "${ktools[*]}") | sha256sum | cut -c1-16)"
  if [ ! -f "$kdir/.from" ] || [ "$(cat "$kdir/.from")" != "$want" ]; then
    log="$logs/kubernetes-module.log"
    echo "  module: deriving $kdir from hack/controlplane/kubernetes (log: $log)"
    rm -rf "$kdir" && mkdir -p "$kdir"
    cp "$here/controlplane/kubernetes/go.mod" "$here/controlplane/kubernetes/go.sum" "$kdir/"
    if ! (cd "$kdir" \
          && GOFLAGS=-mod=mod go list -m all >before.txt \
          && go mod edit $(printf -- '-tool=%s ' "${ktools[@]}") \
          && GOFLAGS=-mod=mod go mod tidy \
          && GOFLAGS=-mod=mod go list -m all >after.txt) >"$log" 2>&1; then
      fail "$log" "deriving the kubelet module failed"
    fi
    # Every module the control plane pins keeps its version (tidy may only add modules).
    moved="$(awk 'NR==FNR { v[$1]=$2; next } ($1 in v) && v[$1] != $2 { print $1 " " v[$1] " -> " $2 }' \
      "$kdir/before.txt" "$kdir/after.txt")"
    if [ -n "$moved" ]; then
      echo "node: deriving the kubelet module moved pinned versions:" >&2
      echo "$moved" >&2
      exit 1
    fi
    cp "$kdir/go.mod" "$logs/kubernetes.go.mod"
    cp "$kdir/go.sum" "$logs/kubernetes.go.sum"
    echo "$want" >"$kdir/.from"
  fi
fi

# build <module dir> <output dir> <output name> <package> [extra ldflags]
build() {
  local dir="$1" outdir="$2" out="$3" pkg="$4" extra="${5:-}"
  local t0 log="$logs/$out.log" stamp
  stamp="$pkg $(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -c1-16) $extra"
  if [ -x "$outdir/$out" ] && [ -f "$outdir/.$out.ok" ] && [ "$(cat "$outdir/.$out.ok")" = "$stamp" ]; then
    echo "  $out: already built"
    return 0
  fi
  t0=$(date +%s)
  echo "  $out: go build $pkg (log: $log)"
  if ! (cd "$dir" && GOFLAGS="-trimpath -mod=readonly" go build -v -ldflags "$ldflags $extra" -o "$outdir/$out.tmp" "$pkg") >"$log" 2>&1; then
    rm -f "$outdir/$out.tmp"
    fail "$log" "building $out failed"
  fi
  mv -f "$outdir/$out.tmp" "$outdir/$out"
  echo "$stamp" >"$outdir/.$out.ok"
  echo "  $out: done in $(($(date +%s) - t0)) s"
}

kv="k8s.io/component-base/version"
kx="-X $kv.gitVersion=$K8S_VERSION -X $kv.gitMajor=1 -X $kv.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $kv.gitTreeState=clean -X $kv.buildDate=1970-01-01T00:00:00Z"
kxv="-X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
build "$kdir" "$bin" kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kx $kxv"
build "$kdir" "$bin" kubelet k8s.io/kubernetes/cmd/kubelet "$kx $kxv"
build "$kdir" "$bin" kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$kx $kxv"

# ---- CoreDNS (the node's cluster DNS) ----------------------------------------------------------
# Its own module (CoreDNS pins a newer client-go than the control plane's): go.mod and go.sum are
# committed in hack/coredns, so the build is read-only and reproducible.
build "$here/coredns" "$bin" coredns lookahead.dev/coredns \
  "-X github.com/coredns/coredns/coremain.GitCommit=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' "$here/coredns/go.mod")"

# ---- CNI plugins ---------------------------------------------------------------------------
cni_stamp="$CNI_VERSION"
ok=1
for b in "${cnis[@]}"; do [ -x "$cni/$b" ] || ok=0; done
if [ $ok = 1 ] && [ -f "$cni/.ok" ] && [ "$(cat "$cni/.ok")" = "$cni_stamp" ]; then
  echo "  cni plugins: already built"
else
  t0=$(date +%s)
  log="$logs/cni-plugins.log"
  echo "  cni plugins: go install github.com/containernetworking/plugins@$CNI_VERSION (log: $log)"
  p=github.com/containernetworking/plugins
  if ! (cd "$src" && GOBIN="$cni" GOFLAGS=-trimpath go install -v \
        -ldflags "$ldflags -X $p/pkg/utils/buildversion.BuildVersion=$CNI_VERSION" \
        "$p/plugins/main/bridge@$CNI_VERSION" "$p/plugins/ipam/host-local@$CNI_VERSION" \
        "$p/plugins/main/loopback@$CNI_VERSION" "$p/plugins/meta/portmap@$CNI_VERSION") >"$log" 2>&1; then
    fail "$log" "building the CNI plugins failed"
  fi
  echo "$cni_stamp" >"$cni/.ok"
  echo "  cni plugins: done in $(($(date +%s) - t0)) s"
fi

# ---- containerd and runc from Debian ---------------------------------------------------------
deb_ok=1
for b in containerd containerd-shim-runc-v2 ctr runc; do [ -x "$bin/$b" ] || deb_ok=0; done
if [ $deb_ok = 1 ] && [ -f "$bin/.debs.ok" ]; then
  echo "  containerd, runc: already extracted ($(cat "$bin/.debs.ok"))"
else
  t0=$(date +%s)
  log="$logs/debs.log"
  echo "  containerd, runc: apt-get download + dpkg-deb -x (log: $log)"
  debs="$root/debs"
  rm -rf "$debs" && mkdir -p "$debs/x"
  # `apt-get download` needs package lists; refresh them only when it cannot find the packages.
  if ! (cd "$debs" && apt-get download containerd runc) >"$log" 2>&1; then
    if ! { apt-get update -q && (cd "$debs" && apt-get download containerd runc); } >>"$log" 2>&1; then
      fail "$log" "apt-get download containerd runc failed"
    fi
  fi
  for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$debs/x" >>"$log" 2>&1; done
  for b in containerd containerd-shim-runc-v2 ctr; do install -m 0755 "$debs/x/usr/bin/$b" "$bin/$b"; done
  install -m 0755 "$debs/x/usr/sbin/runc" "$bin/runc"
  # Debian's runc links libseccomp2 (on every Debian system; said here rather than at the first Pod).
  if ldd "$bin/runc" 2>&1 | grep -q 'not found'; then
    echo "node: runc needs libraries this machine lacks (apt-get install libseccomp2):" >&2
    ldd "$bin/runc" >&2
    exit 1
  fi
  vers="$(for d in "$debs"/*.deb; do dpkg-deb -W --showformat='${Package} ${Version}\n' "$d"; done | paste -sd, -)"
  rm -rf "$debs"
  echo "$vers" >"$bin/.debs.ok"
  echo "  containerd, runc: $vers in $(($(date +%s) - t0)) s"
fi

# ---- the sandbox ("pause") image ------------------------------------------------------------
pdir="$src/pause"
mkdir -p "$pdir"
cat >"$pdir/go.mod" <<'EOF'
module lookahead.dev/pause

go 1.26
EOF
cat >"$pdir/main.go" <<'EOF'
// pause: the sandbox process of every Pod. It holds the Pod's namespaces, reaps zombies (it is
// PID 1 when the Pod shares its PID namespace) and exits on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
EOF
: >"$pdir/go.sum"  # no dependencies
build "$pdir" "$bin" pause lookahead.dev/pause
pause_stamp="$(cat "$bin/.pause.ok") $PAUSE_IMAGE $(sha256sum "$repo/images/ocipack.py" | cut -c1-16)"
if [ -f "$imgs/pause.oci.tar" ] && [ -f "$imgs/.pause.ok" ] && [ "$(cat "$imgs/.pause.ok")" = "$pause_stamp" ]; then
  echo "  pause image: already packed"
else
  log="$logs/pause-image.log"
  prootfs="$src/pause-rootfs"
  rm -rf "$prootfs" && mkdir -p "$prootfs"
  install -m 0755 "$bin/pause" "$prootfs/pause"
  if ! python3 "$repo/images/ocipack.py" --rootfs "$prootfs" --name "$PAUSE_IMAGE" \
      --entrypoint '["/pause"]' --user 65535:65535 --output "$imgs/pause.oci.tar" >"$log" 2>&1; then
    fail "$log" "packing the pause image failed"
  fi
  rm -rf "$prootfs"
  echo "$pause_stamp" >"$imgs/.pause.ok"
  echo "  pause image: $imgs/pause.oci.tar ($PAUSE_IMAGE)"
fi

{
  stamp_text
  echo "kubernetes $K8S_VERSION, coredns $(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3 }' "$here/coredns/go.mod"), cni plugins $CNI_VERSION, $(cat "$bin/.debs.ok"), pause $PAUSE_IMAGE"
} >"$root/versions"
echo "node: built in $(($(date +%s) - start)) s -> $root"
# sed -n 1p reads everything: head -1 would close the pipe early, and the writer's SIGPIPE would
# fail the script (exit 141 under pipefail) after a whole successful build.
"$bin/kubelet" --version | sed -n 1p
"$bin/kube-scheduler" --version | sed -n 1p
"$bin/containerd" --version | sed -n 1p
"$bin/runc" --version | sed -n 1p
"$cni/bridge" --version 2>&1 | sed -n 1p
