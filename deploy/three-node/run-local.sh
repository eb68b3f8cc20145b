#!/bin/sh
# Runs a three-member jobfence cluster on this machine (127.0.0.1 only), for trying
# out failover: three servers whose embedded etcd members form one cluster, sharing one
# tokens file and one dispatch token. Stop it with Ctrl-C.
#
#   deploy/three-node/run-local.sh [path/to/jobfence] [state dir]
set -eu

BIN=${1:-./bin/jobfence}
DIR=${2:-./data/three-node}
mkdir -p "$DIR"
chmod 700 "$DIR"

if [ ! -f "$DIR/tokens.json" ]; then
	umask 077
	printf '[{"subject":"local-operator","role":"operator","token":"%s"},{"subject":"local-agent","role":"agent","token":"%s"}]\n' \
		"$(openssl rand -hex 32)" "$(openssl rand -hex 32)" >"$DIR/tokens.json"
	openssl rand -hex 32 >"$DIR/dispatch-token"
fi

CLUSTER=n1=http://127.0.0.1:12380,n2=http://127.0.0.1:22380,n3=http://127.0.0.1:32380
pids=""
trap 'kill $pids 2>/dev/null; wait' INT TERM EXIT
for i in 1 2 3; do
	"$BIN" server \
		--listen 127.0.0.1:${i}8080 \
		--advertise-url http://127.0.0.1:${i}8080 \
		--data-dir "$DIR/n$i" \
		--replica-id n$i \
		--tokens-file "$DIR/tokens.json" \
		--dispatch-token-file "$DIR/dispatch-token" \
		--etcd-name n$i \
		--etcd-peer-url http://127.0.0.1:${i}2380 \
		--etcd-client-url http://127.0.0.1:${i}2379 \
		--etcd-initial-cluster "$CLUSTER" \
		--log-format text 2>"$DIR/n$i.log" &
	pids="$pids $!"
done
echo "servers: http://127.0.0.1:18080 http://127.0.0.1:28080 http://127.0.0.1:38080"
echo "tokens:  $DIR/tokens.json   logs: $DIR/n*.log"
echo "etcd:    etcdctl --endpoints http://127.0.0.1:12379 member list"
echo "status:  curl -s -H \"Authorization: Bearer \$TOKEN\" http://127.0.0.1:18080/v1/status"
wait
