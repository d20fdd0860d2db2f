#!/usr/bin/env bash
# Push the images hack/build-images.sh built, and the chart, to a registry a user names:
#
#   make images REGISTRY=registry.example.com/ml-platform [TAG=0.1.0]
#
# pushes (with crane, from hack/build-registry.sh; credentials: `crane auth login REGISTRY_HOST`
# or your Docker config)
#   $REGISTRY/lookahead-rollout/lookahead-rollout:$TAG          operator (and default load generator)
#   $REGISTRY/lookahead-rollout/lookahead-rollout-engine:$TAG   reference engine
#   $REGISTRY/lookahead-rollout/lookahead-rollout-loadgen:$TAG  load generator
# and (with helm; credentials: `helm registry login REGISTRY_HOST`) the chart as an OCI chart,
#   oci://$REGISTRY/charts/lookahead-operator, version = the chart's, appVersion = $TAG
# so that `helm install ... --set image.repository=$REGISTRY/lookahead-rollout/lookahead-rollout`
# pulls the tag just pushed (README, "Install on a cluster"). TAG defaults to the project's version.
# A registry with a private CA: SSL_CERT_FILE=<its CA bundle> for both clients.
set -euo pipefail

registry="${1:?usage: push-images.sh REGISTRY [TAG]}"
registry="${registry%/}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | sed -n 1p)"
tag="${2:-$version}"
crane="$cache/registry-v3.1.2/bin/crane"
helm="$cache/controlplane-v1.36.3/bin/helm"
command -v helm >/dev/null 2>&1 && [ ! -x "$helm" ] && helm="$(command -v helm)"
[ -x "$crane" ] || { echo "push-images: crane not found at $crane: run \`make registry\`" >&2; exit 1; }
[ -x "$helm" ] || { echo "push-images: helm not found at $helm or on PATH: run \`make control-plane\`" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for kind in operator engine loadgen; do
  suffix=""; [ "$kind" = operator ] || suffix="-$kind"
  ref="$registry/lookahead-rollout/lookahead-rollout$suffix:$tag"
  archive="$cache/images/$kind.oci.tar"
  [ -f "$archive" ] || { echo "push-images: $archive not found: run \`make images\`" >&2; exit 1; }
  rm -rf "$tmp/layout" && mkdir "$tmp/layout" && tar -xf "$archive" -C "$tmp/layout"
  echo "push-images: $ref"
  "$crane" push "$tmp/layout" "$ref" >/dev/null
done
"$helm" package "$repo/charts/lookahead-operator" --app-version "$tag" --destination "$tmp" >/dev/null
chart="$(ls "$tmp"/lookahead-operator-*.tgz)"
echo "push-images: oci://$registry/charts/$(basename "$chart" .tgz) (appVersion $tag)"
"$helm" push "$chart" "oci://$registry/charts" >/dev/null
echo "push-images: install with"
echo "  helm install lookahead oci://$registry/charts/lookahead-operator --version $(basename "$chart" .tgz | sed 's/^lookahead-operator-//') \\"
echo "    --namespace lookahead-system --create-namespace --set image.repository=$registry/lookahead-rollout/lookahead-rollout"
