#!/bin/sh
# Starts a throwaway etcd on a free 127.0.0.1 port for the discovery tests, installing Debian's
# etcd-server (and protobuf-compiler, which the `etcd` feature's build needs) if missing.
#
#   . scripts/etcd.sh            # exports ETCD_ENDPOINT and ETCD_PID in this shell
#   scripts/etcd.sh -- CMD ...   # runs CMD with ETCD_ENDPOINT set, then stops etcd
#
# Example: scripts/etcd.sh -- cargo test -p backends --features etcd --test etcd
set -eu

need=""
command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || need="$need etcd-server"
command -v protoc >/dev/null 2>&1 || need="$need protobuf-compiler"
if [ -n "$need" ]; then
    echo "etcd.sh: installing$need" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null
fi
ETCD_BIN=$(command -v etcd || echo /usr/bin/etcd)

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
CLIENT_PORT=$(free_port)
PEER_PORT=$(free_port)
ETCD_DATA=$(mktemp -d /tmp/etcd-test.XXXXXX)
"$ETCD_BIN" --name te-test --data-dir "$ETCD_DATA" \
    --listen-client-urls "http://127.0.0.1:$CLIENT_PORT" --advertise-client-urls "http://127.0.0.1:$CLIENT_PORT" \
    --listen-peer-urls "http://127.0.0.1:$PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$PEER_PORT" \
    --initial-cluster "te-test=http://127.0.0.1:$PEER_PORT" >"$ETCD_DATA/etcd.log" 2>&1 &
ETCD_PID=$!
ETCD_ENDPOINT="http://127.0.0.1:$CLIENT_PORT"
export ETCD_ENDPOINT ETCD_PID ETCD_DATA

i=0
until python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$CLIENT_PORT),0.2)" 2>/dev/null; do
    i=$((i + 1))
    if [ $i -gt 100 ] || ! kill -0 "$ETCD_PID" 2>/dev/null; then
        echo "etcd.sh: etcd did not start; its log:" >&2
        cat "$ETCD_DATA/etcd.log" >&2
        exit 1
    fi
    sleep 0.1
done
echo "etcd.sh: etcd (pid $ETCD_PID) serving at ETCD_ENDPOINT=$ETCD_ENDPOINT" >&2

if [ "${1:-}" = "--" ]; then
    shift
    status=0
    "$@" || status=$?
    kill "$ETCD_PID" 2>/dev/null || true
    wait "$ETCD_PID" 2>/dev/null || true
    rm -rf "$ETCD_DATA"
    exit $status
fi
