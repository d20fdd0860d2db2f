#!/usr/bin/env bash
# Debian packages the test suite needs: the real Prometheus server.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
# openssl makes the dev cluster's certificates (lookahead_dev.devcluster).
command -v openssl >/dev/null 2>&1 || need+=(openssl)
# mmdebstrap makes the images' root filesystem (hack/build-images.sh, the real-node tests).
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
# iptables: kube-proxy's Service rules on the real node (lookahead_dev.node; Debian's default is the
# nf_tables backend, iptables-nft).
command -v iptables-restore >/dev/null 2>&1 || need+=(iptables)
if [ ${#need[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need[@]}"
fi
# The Debian package starts a system Prometheus on :9090 via its service; tests run their own.
