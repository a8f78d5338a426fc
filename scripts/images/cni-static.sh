#!/usr/bin/env bash
# Builds cnimesh-cni as a static executable and prints its path on stdout.
#
#   scripts/images/cni-static.sh [--profile release|debug] [--no-build]
#
# The plugin is copied onto every node, whatever its libc (docs/architecture.md, lesson 14), so it links glibc
# statically (`crt-static`; the toolchain has no musl target). The flag goes through RUSTFLAGS
# together with an explicit `--target <host triple>`: with --target, cargo applies RUSTFLAGS to
# the target's crates only, so build scripts and proc-macros (serde_derive, thiserror-impl) stay
# ordinary dynamic host artifacts, and the libc crate is compiled with `crt-static` set and links
# libc.a. The result lands in <target dir>/<host triple>/<profile dir>/cnimesh-cni, beside (not
# over) the dynamic one in <target dir>/<profile dir>/. `--no-build` only resolves and checks it.
set -euo pipefail
cd "$(dirname "$0")/../.."

profile=release
build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="${2:?--profile needs a value}"; shift 2 ;;
    --profile=*) profile="${1#*=}"; shift ;;
    --no-build) build=0; shift ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "cni-static.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$profile" in
  debug | dev) cargo_profile=dev; dir=debug ;;
  *) cargo_profile="$profile"; dir="$profile" ;;
esac

command -v cargo >/dev/null || { echo "cni-static.sh: cargo not found (install a Rust toolchain)" >&2; exit 1; }
command -v ldd >/dev/null || { echo "cni-static.sh: ldd not found (apt install libc-bin)" >&2; exit 1; }
host=$(rustc -vV | sed -n 's/^host: //p')
target_dir=$(cargo metadata --no-deps --format-version 1 | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
[ -n "$host" ] && [ -n "$target_dir" ] || { echo "cni-static.sh: cannot read the host triple or target dir" >&2; exit 1; }

if [ "$build" = 1 ]; then
  RUSTFLAGS="${RUSTFLAGS:+$RUSTFLAGS }-C target-feature=+crt-static" \
    cargo build --profile "$cargo_profile" -p cnimesh-cni --bin cnimesh-cni --target "$host" >&2
fi
bin="$target_dir/$host/$dir/cnimesh-cni"
[ -x "$bin" ] || { echo "cni-static.sh: $bin not built (run without --no-build)" >&2; exit 1; }
# Never hand out a dynamic plugin: ldd says "statically linked" (static-pie) or "not a dynamic
# executable" (static), and exits non-zero for the latter.
if ! LC_ALL=C ldd "$bin" 2>&1 | grep -Eq 'statically linked|not a dynamic executable'; then
  echo "cni-static.sh: $bin is dynamically linked:" >&2
  ldd "$bin" >&2 || true
  exit 1
fi
echo "$bin"
