#!/usr/bin/env bash
# services.sh makes sure the servers the tests use run on loopback, then
# prints ONLY `export NAME=value` lines on stdout, so that callers can do
#
#     eval "$(scripts/services.sh)"
#
# All progress and errors go to stderr. Run it as root: it may start servers
# and, on a fresh Debian machine, install them with apt-get. It is idempotent
# and quick when everything already runs.
#
#   PostgreSQL  127.0.0.1:5432, database idem_test  -> IDEM_TEST_POSTGRES_URL
#   MariaDB     127.0.0.1:3306, database idem_test  -> IDEM_TEST_MYSQL_DSN
#   Redis       delegated to scripts/redis.sh       -> IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_CLUSTER
#   RabbitMQ    127.0.0.1:5672, guest/guest         -> IDEM_TEST_AMQP_URL
#   NATS        127.0.0.1:4222, with JetStream      -> IDEM_TEST_NATS_URL
#   Chromium    /usr/bin/chromium, for the review page's browser test
#
# Flags:
#   --bench   also make sure the load tools the benchmarks compare against
#             (pgbench, mysqlslap) are installed.
#
# A service that cannot be started is reported on stderr and its variable is
# not printed (tests then skip, or fail when CI=true); the script exits 1.
set -uo pipefail

# Keep the real stdout for the export lines; everything else goes to stderr.
exec 3>&1 1>&2
# Every server this script starts gets `</dev/null 3>&-`: a daemon that kept fd 3
# would hold the caller's $(...) open for as long as it runs, so
# eval "$(scripts/services.sh)" would never return.

cd "$(dirname "$0")/.." || exit 1

bench=0
for arg in "$@"; do
	case "$arg" in
	--bench) bench=1 ;;
	-h | --help)
		sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'
		exit 0
		;;
	*)
		echo "services.sh: unknown argument $arg" >&2
		exit 2
		;;
	esac
done

failed=0
apt_updated=0

log() { echo "services.sh: $*" >&2; }
emit() { printf "export %s='%s'\n" "$1" "$2" >&3; }

apt_install() {
	if [ "$(id -u)" != 0 ]; then
		log "need to install $*, but not running as root"
		return 1
	fi
	if [ "$apt_updated" = 0 ]; then
		log "apt-get update"
		apt-get update -qq || return 1
		apt_updated=1
	fi
	log "apt-get install $*"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" || return 1
}

# wait_until TIMEOUT_SECONDS CMD...: retry CMD every half second, bounded.
wait_until() {
	local deadline=$((SECONDS + $1))
	shift
	until "$@" >/dev/null 2>&1; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			return 1
		fi
		sleep 0.5
	done
}

# ---------------------------------------------------------------- PostgreSQL

pg_ready() { pg_isready -q -h 127.0.0.1 -p 5432; }

pg_start() {
	if command -v pg_isready >/dev/null 2>&1 && pg_ready; then
		return 0
	fi
	if [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
		log "PostgreSQL not installed; installing"
		apt_install postgresql || return 1
	fi
	local version
	version=$(ls /etc/postgresql | sort -V | tail -n1)
	if ! pg_ready; then
		log "starting PostgreSQL $version"
		pg_ctlcluster --skip-systemctl-redirect "$version" main start </dev/null 3>&- || return 1
	fi
	if ! wait_until 30 pg_ready; then
		log "PostgreSQL did not become ready within 30s"
		return 1
	fi
}

# pg_psql runs psql as superuser over TCP, as the tests will connect. If that
# is refused (no trust auth for 127.0.0.1), it says so and falls back to the
# postgres OS user over the local socket so the database can still be made.
pg_psql() {
	local out
	if out=$(psql -X -w -h 127.0.0.1 -U postgres -d postgres -Atc "$1" 2>&1); then
		printf '%s\n' "$out"
		return 0
	fi
	log "psql -h 127.0.0.1 -U postgres failed: $out"
	log "the tests connect as postgres@127.0.0.1 without a password; allow that (trust) in pg_hba.conf or set PGPASSWORD"
	if [ "$(id -u)" = 0 ] && command -v runuser >/dev/null 2>&1; then
		runuser -u postgres -- psql -X -d postgres -Atc "$1"
		return $?
	fi
	return 1
}

pg_setup() {
	pg_start || return 1
	local exists
	exists=$(pg_psql "SELECT 1 FROM pg_database WHERE datname = 'idem_test'") || return 1
	if [ "$exists" != 1 ]; then
		log "creating PostgreSQL database idem_test"
		pg_psql "CREATE DATABASE idem_test" >/dev/null || return 1
	fi
	# Fail here, not in every test, if the URL we print cannot be used.
	if ! psql -X -w "postgres://postgres@127.0.0.1:5432/idem_test?sslmode=disable" -Atc 'SELECT 1' >/dev/null; then
		log "cannot connect to postgres://postgres@127.0.0.1:5432/idem_test"
		return 1
	fi
	emit IDEM_TEST_POSTGRES_URL 'postgres://postgres@127.0.0.1:5432/idem_test?sslmode=disable'
}

# ------------------------------------------------------------------- MariaDB

my_ready() { mysqladmin --connect-timeout=2 -uroot ping; }

my_start() {
	if command -v mysqladmin >/dev/null 2>&1 && my_ready >/dev/null 2>&1; then
		return 0
	fi
	if [ ! -x /usr/sbin/mariadbd ]; then
		log "MariaDB not installed; installing"
		apt_install mariadb-server || return 1
	fi
	if ! my_ready >/dev/null 2>&1; then
		log "starting MariaDB"
		install -d -o mysql -g mysql /run/mysqld || return 1
		start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd </dev/null 3>&- || return 1
	fi
	if ! wait_until 30 my_ready; then
		log "MariaDB did not become ready within 30s (see /var/log/mysql/error.log)"
		return 1
	fi
}

my_setup() {
	my_start || return 1
	if ! mysql -uroot -h 127.0.0.1 -P 3306 -e 'CREATE DATABASE IF NOT EXISTS idem_test'; then
		log "cannot create database idem_test as root@127.0.0.1 without a password"
		return 1
	fi
	emit IDEM_TEST_MYSQL_DSN 'root@tcp(127.0.0.1:3306)/idem_test?parseTime=true'
}

# --------------------------------------------------------------------- Redis

redis_setup() {
	if [ ! -x scripts/redis.sh ]; then
		log "scripts/redis.sh missing or not executable; skipping Redis"
		return 0
	fi
	scripts/redis.sh >&3
}

# ------------------------------------------------------------------ RabbitMQ

# rabbit_ready: the AMQP port answers a protocol header with a
# connection.start frame (type 1), which RabbitMQ sends once it is booted.
rabbit_ready() {
	local reply
	reply=$(timeout 5 bash -c 'exec 9<>/dev/tcp/127.0.0.1/5672 && printf "AMQP\0\0\11\1" >&9 && head -c 1 <&9 | od -An -tu1' 2>/dev/null) || return 1
	[ "$(echo $reply)" = 1 ]
}

rabbit_setup() {
	if rabbit_ready; then
		emit IDEM_TEST_AMQP_URL 'amqp://guest:guest@127.0.0.1:5672/'
		return 0
	fi
	if [ ! -x /usr/sbin/rabbitmq-server ]; then
		log "RabbitMQ not installed; installing"
		apt_install rabbitmq-server || return 1
	fi
	if ! rabbit_ready; then
		log "starting RabbitMQ"
		rabbitmq-server -detached </dev/null 3>&- || return 1
	fi
	if ! wait_until 90 rabbit_ready; then
		log "RabbitMQ did not become ready within 90s (see /var/log/rabbitmq)"
		return 1
	fi
	emit IDEM_TEST_AMQP_URL 'amqp://guest:guest@127.0.0.1:5672/'
}

# ---------------------------------------------------------------------- NATS

# nats_ready: the server greets with an INFO line that says JetStream is on.
nats_ready() {
	timeout 5 bash -c 'exec 9<>/dev/tcp/127.0.0.1/4222 && head -n 1 <&9' 2>/dev/null | grep -q '"jetstream":true'
}

nats_setup() {
	if ! nats_ready; then
		if [ ! -x /usr/sbin/nats-server ]; then
			log "nats-server not installed; installing"
			apt_install nats-server || return 1
		fi
		log "starting nats-server with JetStream"
		install -d /var/lib/nats-server || return 1
		start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
			-a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log </dev/null 3>&- || return 1
		if ! wait_until 30 nats_ready; then
			log "NATS did not become ready with JetStream within 30s (see /var/log/nats-server.log)"
			return 1
		fi
	fi
	emit IDEM_TEST_NATS_URL 'nats://127.0.0.1:4222'
}

# ------------------------------------------------------------------ Chromium

# The review page is tested in Debian's headless chromium (chromedp); the test
# finds it at /usr/bin/chromium.
chromium_setup() {
	if [ -x /usr/bin/chromium ]; then
		return 0
	fi
	log "Chromium not installed; installing"
	apt_install chromium || return 1
}

# --------------------------------------------------------------------- tools

bench_tools() {
	if ! pgbench --version >/dev/null 2>&1; then
		apt_install postgresql-client postgresql-contrib || return 1
	fi
	if ! mysqlslap --version >/dev/null 2>&1; then
		apt_install mariadb-client || return 1
	fi
}

pg_setup || { log "PostgreSQL: FAILED"; failed=1; }
my_setup || { log "MariaDB: FAILED"; failed=1; }
redis_setup || { log "Redis: FAILED"; failed=1; }
rabbit_setup || { log "RabbitMQ: FAILED"; failed=1; }
nats_setup || { log "NATS: FAILED"; failed=1; }
chromium_setup || { log "Chromium: FAILED"; failed=1; }
if [ "$bench" = 1 ]; then
	bench_tools || { log "benchmark tools: FAILED"; failed=1; }
fi
exit "$failed"
