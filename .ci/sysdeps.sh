#!/usr/bin/env bash
# Installs the Debian packages ragpool's local services and tests use, if missing.
set -euo pipefail
need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# Sentinel: the failover tests (tests/training/scheduler/test_failover.py) start three.
command -v redis-sentinel >/dev/null 2>&1 || need+=(redis-sentinel)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v redis-benchmark >/dev/null 2>&1 || need+=(redis-tools)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
command -v jq >/dev/null 2>&1 || need+=(jq)
command -v npm >/dev/null 2>&1 || need+=(npm)
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else
    echo "ragpool needs: ${need[*]} (apt-get install ${need[*]}); run as root or install them first" >&2
    exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The Debian package starts system services we don't use; the tests start their own.
$SUDO systemctl disable --now redis-server redis-sentinel prometheus >/dev/null 2>&1 || true
