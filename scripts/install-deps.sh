#!/usr/bin/env bash
# Installs the Debian packages that optional parts need, if missing: protoc (etcd-client's build) and
# etcd-server (the etcd discovery tests). Idempotent; quiet when everything is there.
set -euo pipefail
need=()
command -v protoc >/dev/null 2>&1 || need+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
