#!/usr/bin/env bash
# The system tools `make test` and `make demo` need, checked before anything else runs:
#   sshd (openssh-server: a real sshd on loopback), GNU patch (the oracle), git, rsync
#   (the push benchmark's baseline), make; podman with runc (its runtime here: crun fails on
#   these machines' cgroup layout), catatonit (podman's --init) and debootstrap (the test
#   image's Debian tree): the [container] tests run real containers.
# Missing ones are installed with apt when this runs as root on a machine with apt-get;
# otherwise (or with DDTREE_DEPLOY_NO_SYSTEM_INSTALL=1, or --check) it stops with one line
# saying exactly what to install, exit 1. Used by the Makefile and by .ci/run.
# SSHD names the sshd binary to look for when it is not on PATH (default /usr/sbin/sshd,
# where Debian puts it and where ddtree_deploy/sandbox/sshd.py starts it).
set -euo pipefail

no_install="${DDTREE_DEPLOY_NO_SYSTEM_INSTALL:-}"
if [ "${1:-}" = "--check" ]; then no_install=1; fi

missing=()   # "tool (package)" for the message
packages=()  # the Debian/Ubuntu package names
need() { missing+=("$1 ($2)"); packages+=("$2"); }

command -v sshd >/dev/null 2>&1 || [ -x "${SSHD:-/usr/sbin/sshd}" ] || need sshd openssh-server
if ! command -v patch >/dev/null 2>&1; then
  need "GNU patch" patch
elif ! patch --version 2>/dev/null | grep -q "GNU patch"; then
  need "GNU patch, found $(command -v patch) which is not GNU" patch
fi
command -v git >/dev/null 2>&1 || need git git
command -v rsync >/dev/null 2>&1 || need rsync rsync
command -v make >/dev/null 2>&1 || need make make
command -v podman >/dev/null 2>&1 || need podman podman
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || need runc runc
[ -x /usr/libexec/podman/catatonit ] || command -v catatonit >/dev/null 2>&1 || need "catatonit (podman --init)" catatonit
command -v debootstrap >/dev/null 2>&1 || [ -x /usr/sbin/debootstrap ] || need debootstrap debootstrap

[ ${#packages[@]} -eq 0 ] && exit 0

if [ -z "$no_install" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "system-deps: installing ${packages[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${packages[@]}" >/dev/null
  exit 0
fi

sudo=""
[ "$(id -u 2>/dev/null || echo 1)" = 0 ] || sudo="sudo "
listed="${missing[0]}"
for m in "${missing[@]:1}"; do listed+=", $m"; done
echo "missing system tools: $listed; install them first: ${sudo}apt-get install -y ${packages[*]} (Debian/Ubuntu package names)" >&2
exit 1
