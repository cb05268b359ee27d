#!/usr/bin/env bash
# Ensures the Redis servers idem's tests use are running on loopback, then
# prints the environment they read, as export lines, on stdout:
#
#   eval "$(scripts/redis.sh)"
#
# - a standalone Redis on 127.0.0.1:6379            -> IDEM_TEST_REDIS_URL
# - a Redis Cluster of 3 masters on 7000-7002, each
#   with one replica on 7003-7005 (the replicas let
#   the tests run CLUSTER FAILOVER)                  -> IDEM_TEST_REDIS_CLUSTER
#
# Run as root. Idempotent: nodes that answer are left alone and the cluster is
# created only once, so a second run takes well under a second. Progress goes
# to stderr; stdout carries only the export lines.
set -euo pipefail

# Keep stdout for the export lines; everything else goes to stderr.
exec 3>&1 1>&2
# Every server this script starts gets `</dev/null 3>&-`: a daemon that kept fd 3
# would hold the caller's $(...) open for as long as it runs, so
# eval "$(scripts/redis.sh)" would never return.

log() { printf 'redis.sh: %s\n' "$*" >&2; }

CLUSTER_DIR=/var/lib/idem-redis-cluster
MASTERS=(7000 7001 7002)
REPLICAS=(7003 7004 7005) # REPLICAS[i] replicates MASTERS[i]

ping() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

wait_ping() {
	local port=$1 i
	for i in $(seq 1 100); do
		ping "$port" && return 0
		sleep 0.1
	done
	log "redis on port $port did not answer"
	return 1
}

cluster_info() { redis-cli -h 127.0.0.1 -p "$1" cluster info 2>/dev/null | tr -d '\r'; }

install_redis() {
	if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
		return 0
	fi
	log "installing redis-server and redis-tools from Debian"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -qq
	apt-get install -y -qq redis-server redis-tools
}

start_standalone() {
	if ping 6379; then
		log "standalone redis already running on 6379"
		return 0
	fi
	log "starting standalone redis on 6379"
	mkdir -p /var/lib/redis /var/log/redis
	redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
		--dir /var/lib/redis --logfile /var/log/redis/ci.log </dev/null 3>&-
	wait_ping 6379
}

start_node() {
	local port=$1 dir=$CLUSTER_DIR/$1
	if ping "$port"; then
		return 0
	fi
	log "starting cluster node on $port"
	mkdir -p "$dir"
	redis-server --daemonize yes --bind 127.0.0.1 --port "$port" \
		--cluster-enabled yes --cluster-config-file "$dir/nodes.conf" --cluster-node-timeout 5000 \
		--save "" --appendonly no --dir "$dir" --logfile "$dir/redis.log" \
		--pidfile "$dir/redis.pid" </dev/null 3>&-
}

# known_nodes prints how many nodes the node on port knows, itself included.
known_nodes() { cluster_info "$1" | sed -n 's/^cluster_known_nodes:\([0-9]*\)$/\1/p'; }

create_cluster() {
	# A node that knows only itself and holds no slots has never joined a cluster.
	if [ "$(known_nodes 7000)" != 1 ]; then
		log "cluster already created"
		return 0
	fi
	log "creating the cluster (3 masters)"
	redis-cli --cluster create "${MASTERS[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes
}

add_replicas() {
	local i port master id
	for i in "${!REPLICAS[@]}"; do
		port=${REPLICAS[$i]}
		master=${MASTERS[$i]}
		[ "$(known_nodes "$port")" = 1 ] || continue
		id=$(redis-cli -h 127.0.0.1 -p "$master" cluster myid | tr -d '\r')
		log "adding $port as replica of $master"
		redis-cli --cluster add-node "127.0.0.1:$port" "127.0.0.1:$master" \
			--cluster-slave --cluster-master-id "$id"
	done
}

wait_cluster() {
	local i port ok
	for i in $(seq 1 200); do
		ok=1
		for port in "${MASTERS[@]}" "${REPLICAS[@]}"; do
			if ! cluster_info "$port" | grep -qx 'cluster_state:ok'; then
				ok=0
				break
			fi
		done
		if [ "$ok" = 1 ] && [ "$(known_nodes 7000)" = 6 ]; then
			log "cluster_state:ok on all 6 nodes"
			return 0
		fi
		sleep 0.1
	done
	log "cluster did not reach cluster_state:ok"
	cluster_info 7000 >&2
	return 1
}

install_redis
start_standalone
for port in "${MASTERS[@]}" "${REPLICAS[@]}"; do start_node "$port"; done
for port in "${MASTERS[@]}" "${REPLICAS[@]}"; do wait_ping "$port"; done
create_cluster
add_replicas
wait_cluster

echo "export IDEM_TEST_REDIS_URL=redis://127.0.0.1:6379/0" >&3
echo "export IDEM_TEST_REDIS_CLUSTER=127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002" >&3
