#!/usr/bin/env bash
# Installs (from Debian's packages) and starts PostgreSQL, RabbitMQ and ClickHouse for
# development and tests, idempotently: what is installed is not reinstalled, what runs is
# left running. Prints each step. On a machine where it cannot (not root, not Debian), it
# says what to do instead: point LOCKS_*_URL at your own servers and set LOCKS_SKIP_SERVICES=1.
# With --tests it also runs the tests' own PostgreSQL cluster on 127.0.0.1:5433 (below).
set -euo pipefail
tests=0
case "${1:-}" in
  --tests) tests=1 ;;
  "") ;;
  *) printf '[services] ERROR: unknown argument %s (the only one is --tests)\n' "$1" >&2; exit 2 ;;
esac

say() { printf '[services] %s\n' "$*" >&2; }
die() { printf '[services] ERROR: %s\n' "$*" >&2; exit 1; }

if [ "${LOCKS_SKIP_SERVICES:-}" = 1 ]; then
  say "LOCKS_SKIP_SERVICES=1: using the servers named by LOCKS_*_URL as they are"
  exit 0
fi

cannot() {
  die "$1
  This script installs and starts the servers only on Debian as root. Otherwise, run
  PostgreSQL 15+, RabbitMQ 3.10+ and ClickHouse yourself, point LOCKS_POSTGRES_URL,
  LOCKS_AMQP_URL and LOCKS_CLICKHOUSE_URL at them, and set LOCKS_SKIP_SERVICES=1."
}

[ -r /etc/debian_version ] || cannot "this is not Debian (no /etc/debian_version)."
[ "$(id -u)" = 0 ] || cannot "this is not root (apt-get and service need it)."

missing=()
# chromium: the dashboard's browser tests (ui/) drive it headless.
for pkg in postgresql rabbitmq-server clickhouse-server clickhouse-client chromium; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# docker-compose validates deploy/compose/compose.yaml (docker-compose config, no daemon).
dpkg-query -W -f='${Status}' docker-compose 2>/dev/null | grep -q "install ok installed" || missing+=(docker-compose)
# promtool (in Debian's prometheus package) checks deploy/prometheus/alerts.yml in the tests.
dpkg-query -W -f='${Status}' prometheus 2>/dev/null | grep -q "install ok installed" || missing+=(prometheus)
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} from Debian's packages (a few minutes the first time)…"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null || die "apt-get update failed"
  # Debian's policy-rc.d may deny starting services at install; we start them below.
  apt-get install -y -q "${missing[@]}" >/tmp/locks-apt.log 2>&1 ||
    die "apt-get install ${missing[*]} failed; see /tmp/locks-apt.log"
  say "installed ${missing[*]}"
fi
# Installing Debian's prometheus starts a Prometheus server on :9090 (LOCKS_GRPC_ADDR's port)
# and a node exporter where no policy-rc.d forbids it; only promtool is wanted from it.
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
  for svc in prometheus prometheus-node-exporter; do
    service "$svc" stop >/dev/null 2>&1 || true
    if command -v systemctl >/dev/null; then systemctl disable "$svc" >/dev/null 2>&1 || true; fi
  done
fi

wait_port() { # name port seconds
  local i
  for ((i = 0; i <= $3 * 4; i++)); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$2") 2>/dev/null; then return 0; fi
    [ "$3" = 0 ] || sleep 0.25
  done
  return 1
}

# PostgreSQL: the default URL connects over TCP as "postgres" without a password, so trust
# loopback connections (this is a local development server; production sets its own auth).
hba=$(ls /etc/postgresql/*/main/pg_hba.conf 2>/dev/null | sort -V | tail -1)
[ -n "$hba" ] || die "no PostgreSQL cluster found under /etc/postgresql; run: pg_createcluster 15 main"
if ! grep -q '^# lock-sensors: trust loopback' "$hba"; then
  say "PostgreSQL: trusting loopback TCP connections in $hba (local development only)"
  tmp=$(mktemp)
  { echo '# lock-sensors: trust loopback'
    echo 'host all all 127.0.0.1/32 trust'
    echo 'host all all ::1/128 trust'
    cat "$hba"; } >"$tmp"
  cat "$tmp" >"$hba"; rm -f "$tmp"
fi
conf=$(dirname "$hba")/postgresql.conf
if ! grep -q '^# lock-sensors tuning' "$conf"; then
  # Tests create many databases and connections; the default 100 connections is tight.
  printf '%s\n' '# lock-sensors tuning' 'max_connections = 300' 'shared_buffers = 256MB' >>"$conf"
fi
if ! wait_port postgres 5432 0; then
  say "starting PostgreSQL…"
  service postgresql start >/dev/null
fi
wait_port postgres 5432 60 || die "PostgreSQL did not listen on 127.0.0.1:5432; see /var/log/postgresql/"
# Settings take effect only after a reload (pg_hba) or restart (max_connections): check what
# the running server does rather than trusting that an earlier run got that far.
pgq() { su postgres -c "psql -XtAq -c \"$1\"" 2>/dev/null; }
if [ "$(pgq 'show max_connections')" != 300 ]; then
  say "restarting PostgreSQL for its new settings…"
  service postgresql restart >/dev/null
  wait_port postgres 5432 60 || die "PostgreSQL did not come back; see /var/log/postgresql/"
fi
if ! psql -XtAqw -h 127.0.0.1 -U postgres -d postgres -c 'select 1' >/dev/null 2>&1; then
  service postgresql reload >/dev/null
  sleep 1
  psql -XtAqw -h 127.0.0.1 -U postgres -d postgres -c 'select 1' >/dev/null ||
    die "cannot connect to PostgreSQL as postgres over 127.0.0.1 without a password; check $hba"
fi
say "PostgreSQL ready on 127.0.0.1:5432"

# --tests: the tests' own cluster on 127.0.0.1:5433 (`go tool task test` points
# LOCKS_TEST_POSTGRES_URL at it). Its databases live for one test: made from a template and
# dropped by the hundred per run, never kept. So it runs without fsync and full-page writes. A
# killed process still loses nothing the kernel holds, and the cluster skips the forced
# checkpoints' disk flushes, which the tests do not need. `go tool task up` and the benchmarks
# keep the durable cluster above, and do not start this one.
if [ "$tests" = 1 ]; then
  ver=$(basename "$(dirname "$(dirname "$hba")")")
  tconf=/etc/postgresql/$ver/locks_test
  if [ ! -f "$tconf/postgresql.conf" ]; then
    say "PostgreSQL: creating the tests' cluster $ver/locks_test on 127.0.0.1:5433 (no fsync; test databases only)…"
    pg_createcluster "$ver" locks_test -p 5433 -- --auth-host=trust --auth-local=peer >/dev/null ||
      die "pg_createcluster $ver locks_test failed (is port 5433 taken?); remove it with: pg_dropcluster --stop $ver locks_test"
  fi
  if [ ! -f "$tconf/conf.d/locks-test.conf" ]; then
    printf '%s\n' '# lock-sensors tests: throwaway databases, many connections' \
      "listen_addresses = '127.0.0.1'" 'max_connections = 300' 'shared_buffers = 256MB' \
      'fsync = off' 'full_page_writes = off' >"$tconf/conf.d/locks-test.conf"
  fi
  if ! wait_port postgres-tests 5433 0; then
    say "starting the tests' PostgreSQL…"
    pg_ctlcluster "$ver" locks_test start || die "the tests' PostgreSQL did not start; see /var/log/postgresql/postgresql-$ver-locks_test.log"
  fi
  wait_port postgres-tests 5433 60 || die "the tests' PostgreSQL did not listen on 127.0.0.1:5433; see /var/log/postgresql/postgresql-$ver-locks_test.log"
  say "PostgreSQL for tests ready on 127.0.0.1:5433"
fi

if ! wait_port rabbitmq 5672 0; then
  say "starting RabbitMQ…"
  service rabbitmq-server start >/dev/null || die "RabbitMQ did not start; see /var/log/rabbitmq/"
fi
wait_port rabbitmq 5672 120 || die "RabbitMQ did not listen on 127.0.0.1:5672; see /var/log/rabbitmq/"
say "RabbitMQ ready on 127.0.0.1:5672"
# The tests' queues (sensor.readings_<time>_<random>, internal/testenv) that a killed test run
# left behind expire after six hours unused; no queue name of the product matches.
rabbitmqctl -q set_policy --apply-to queues locks-test-leftovers '^sensor\.readings_[0-9a-z]{6,7}_[0-9a-f]{8}' \
  '{"expires":21600000}' >/dev/null 2>&1 ||
  say "RabbitMQ: could not set the expiry of test queues (rabbitmqctl set_policy); a killed test run's queues stay"

if ! wait_port clickhouse 9000 0; then
  say "starting ClickHouse…"
  service clickhouse-server start >/dev/null || die "ClickHouse did not start; see /var/log/clickhouse-server/"
fi
wait_port clickhouse 9000 60 || die "ClickHouse did not listen on 127.0.0.1:9000; see /var/log/clickhouse-server/"
say "ClickHouse ready on 127.0.0.1:9000"
