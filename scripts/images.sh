#!/usr/bin/env bash
# Builds the three cnimesh images OFFLINE from the workspace's binaries (docs/install/images.md):
#
#   ghcr.io/cnimesh/cnimesh-node:<version>     /usr/local/bin/cnimesh-node + /opt/cnimesh/cnimesh-cni (static)
#   ghcr.io/cnimesh/cnimesh-control:<version>  /usr/local/bin/cnimesh-control
#   ghcr.io/cnimesh/cnimesh-proxy:<version>    /usr/local/bin/cnimesh-proxy
#
# <version> is the workspace version (cargo metadata). Each image is built FROM scratch from
# scripts/images/<name>/Containerfile: the stripped binary, the shared libraries ldd lists for it,
# /etc/passwd, /etc/group and /etc/nsswitch.conf. Nothing is pulled from a registry.
#
#   scripts/images.sh [--profile release|debug] [--no-build] [--bin-dir DIR] [--out DIR]
#                     [--storage DIR] [--tag TAG] [--tool buildah|podman]
#
#   --profile P    cargo profile of the binaries (default release)
#   --no-build     do not run cargo; use the binaries already in the target dir
#   --bin-dir DIR  take cnimesh-node, cnimesh-control, cnimesh-mirror, cnimesh-proxy and cnimesh-cni (static) from
#                  DIR instead of the target dir (implies --no-build)
#   --out DIR      also write DIR/<name>-<tag>.oci.tar (OCI archives for `podman load -i` or
#                  `ctr -n k8s.io images import`)
#   --storage DIR  use a private container storage in DIR (vfs driver) instead of the system's
#   --tag TAG      tag instead of the workspace version
#   --tool T       build with buildah or podman (default: buildah, or podman when buildah is absent)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

die() { echo "images.sh: $*" >&2; exit 1; }

profile=release
build=1
bin_dir=""
out=""
storage=""
tag=""
tool=""
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs a value}"; shift 2 ;;
    --no-build) build=0; shift ;;
    --bin-dir) bin_dir="${2:?--bin-dir needs a directory}"; build=0; shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    --storage) storage="${2:?--storage needs a directory}"; shift 2 ;;
    --tag) tag="${2:?--tag needs a value}"; shift 2 ;;
    --tool) tool="${2:?--tool needs buildah or podman}"; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
case "$profile" in
  debug | dev) cargo_profile=dev; dir=debug ;;
  *) cargo_profile="$profile"; dir="$profile" ;;
esac

command -v cargo >/dev/null || die "cargo not found: install a Rust toolchain (rustup)"
command -v ldd >/dev/null || die "ldd not found: apt install libc-bin"
command -v strip >/dev/null || die "strip not found: apt install binutils"
case "$tool" in
  "")
    if command -v buildah >/dev/null; then
      tool=buildah
    elif command -v podman >/dev/null; then
      tool=podman
    else
      die "neither buildah nor podman found: apt install buildah podman (or run scripts/setup.sh)"
    fi
    ;;
  buildah | podman) command -v "$tool" >/dev/null || die "$tool not found: apt install $tool" ;;
  *) die "--tool takes buildah or podman, not $tool" ;;
esac
tool_args=()
if [ -n "$storage" ]; then
  mkdir -p "$storage"
  storage=$(cd "$storage" && pwd)
  tool_args=(--root "$storage/root" --runroot "$storage/run" --storage-driver vfs)
fi

metadata=$(cargo metadata --no-deps --format-version 1)
version=$(printf '%s' "$metadata" | grep -o '"name":"cnimesh-node","version":"[^"]*"' | sed 's/.*"version":"\([^"]*\)"/\1/')
target_dir=$(printf '%s' "$metadata" | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$version" ] || die "cannot read the workspace version from cargo metadata"
tag="${tag:-$version}"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)

if [ -n "$bin_dir" ]; then
  bins="$bin_dir"
  plugin="$bin_dir/cnimesh-cni"
  LC_ALL=C ldd "$plugin" 2>&1 | grep -Eq 'statically linked|not a dynamic executable' \
    || die "$plugin is not statically linked (build it with scripts/images/cni-static.sh)"
else
  if [ "$build" = 1 ]; then
    cargo build --profile "$cargo_profile" --bin cnimesh-node --bin cnimesh-control --bin cnimesh-mirror \
      --bin cnimesh-proxy -p cnimesh-node -p cnimesh-control -p cnimesh-mirror -p cnimesh-proxy
    plugin=$(scripts/images/cni-static.sh --profile "$profile")
  else
    plugin=$(scripts/images/cni-static.sh --profile "$profile" --no-build)
  fi
  bins="$target_dir/$dir"
fi
for b in cnimesh-node cnimesh-control cnimesh-mirror cnimesh-proxy; do
  [ -x "$bins/$b" ] || die "$bins/$b not found (build it, or drop --no-build)"
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Copies the shared libraries a binary needs (per ldd, incl. the dynamic loader) under $2/lib/,
# at the paths the binary looks for them.
copy_libs() {
  local binary="$1" dest="$2" lib
  for lib in $(LC_ALL=C ldd "$binary" 2>/dev/null | grep -o '/[^ ]*' || true); do
    mkdir -p "$dest/lib$(dirname "$lib")"
    cp -L "$lib" "$dest/lib$lib"
  done
}

# stage <image> <binary source>:<path under bin/>...
stage() {
  local name="$1" ctx="$work/$1" pair
  shift
  mkdir -p "$ctx/bin" "$ctx/lib"
  cp -r "$root/scripts/images/$name/." "$ctx/"
  for pair in "$@"; do
    strip --strip-debug -o "$ctx/bin/${pair#*:}" "${pair%%:*}"
    copy_libs "$ctx/bin/${pair#*:}" "$ctx"
  done
}

stage cnimesh-node "$bins/cnimesh-node:cnimesh-node" "$plugin:cnimesh-cni"
# The mirror ships in the control plane's image, run as its own Deployment (its own command).
stage cnimesh-control "$bins/cnimesh-control:cnimesh-control" "$bins/cnimesh-mirror:cnimesh-mirror"
stage cnimesh-proxy "$bins/cnimesh-proxy:cnimesh-proxy"

[ -z "$out" ] || mkdir -p "$out"
for name in cnimesh-node cnimesh-control cnimesh-proxy; do
  image="ghcr.io/cnimesh/$name:$tag"
  "$tool" "${tool_args[@]}" build --quiet --format oci -f "$work/$name/Containerfile" -t "$image" \
    --build-arg "VERSION=$version" --build-arg "REVISION=$revision" --build-arg "CREATED=$created" \
    "$work/$name" >/dev/null
  size=$(du -sk --apparent-size "$work/$name/bin" "$work/$name/lib" "$work/$name/etc" | awk '{ s += $1 } END { printf "%.1f MiB", s / 1024 }')
  echo "built $image ($size)"
  if [ -n "$out" ]; then
    archive="$out/$name-$tag.oci.tar"
    rm -f "$archive"
    if [ "$tool" = buildah ]; then
      buildah "${tool_args[@]}" push --quiet "$image" "oci-archive:$archive:$image" >/dev/null
    else
      podman "${tool_args[@]}" save --quiet --format oci-archive -o "$archive" "$image"
    fi
    echo "wrote $archive"
  fi
done
