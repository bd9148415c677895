#!/usr/bin/env bash
# Install (when missing) and start PostgreSQL, Redis and Prometheus for tests, on project-local data dirs and
# ports.
# Idempotent: a second run finds them running and does nothing. Works as root (PostgreSQL then runs as the
# "postgres" system user, which refuses root). Prints the DATABASE_URL / REDIS_URL / PROMETHEUS_URL
# to use.
#
#   scripts/services.sh start|stop|status|env
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUN="${CLAIMSCOPE_SERVICES_DIR:-$ROOT/.run/services}"
PG_PORT="${CLAIMSCOPE_PG_PORT:-55432}"
REDIS_PORT="${CLAIMSCOPE_REDIS_PORT:-56379}"
# PostgreSQL runs as the "postgres" user when we are root, and a checkout under /root (mode 0700) is out
# of its reach: keep its data outside the checkout, one folder per port.
if [ "$(id -u)" = 0 ]; then
  PG_DATA="${CLAIMSCOPE_PG_DATA:-/var/tmp/claimscope-pg-$PG_PORT}"
else
  PG_DATA="${CLAIMSCOPE_PG_DATA:-$RUN/pg}"
fi
REDIS_DIR="$RUN/redis"
PROM_PORT="${CLAIMSCOPE_PROMETHEUS_PORT:-59090}"
PROM_DIR="$RUN/prometheus"

log() { echo "services: $*" >&2; }

apt_install() {
  if [ "$(id -u)" != 0 ]; then
    log "need $* but not root: install them (apt-get install $*) and rerun"; exit 1
  fi
  log "installing $* with apt-get"
  if [ -z "${_APT_UPDATED:-}" ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    _APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2
}

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$dir" ] || [ ! -x "$dir/postgres" ]; then
    apt_install postgresql >&2
    dir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  echo "$dir"
}

as_pg() {
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

start_pg() {
  local bin
  bin=$(pg_bin)
  mkdir -p "$RUN"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home /var/lib/postgresql --shell /bin/bash postgres
  fi
  if [ ! -f "$PG_DATA/PG_VERSION" ]; then
    if [ "$(id -u)" = 0 ]; then
      install -d -o postgres -m 700 "$PG_DATA"
    else
      mkdir -p "$PG_DATA"
    fi
    as_pg "$bin/initdb" -D "$PG_DATA" -U claimscope --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >>"$PG_DATA/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DATA'
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 256MB
max_connections = 200
CONF
  fi
  if as_pg "$bin/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1; then
    log "PostgreSQL already running on $PG_PORT"
  elif "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT" && \
    as_pg "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U claimscope -d postgres -tAc "SELECT 1" >/dev/null 2>&1; then
    # A server of ours from another checkout or data folder already listens there: use it.
    log "PostgreSQL already running on $PG_PORT (data elsewhere)"
  else
    as_pg "$bin/pg_ctl" -D "$PG_DATA" -l "$PG_DATA/server.log" -w -t 60 start >/dev/null
    log "PostgreSQL started on 127.0.0.1:$PG_PORT"
  fi
  as_pg "$bin/psql" -h 127.0.0.1 -p "$PG_PORT" -U claimscope -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname='claimscope'" | grep -q 1 ||
    as_pg "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U claimscope claimscope
}

start_redis() {
  command -v redis-server >/dev/null || apt_install redis-server
  mkdir -p "$REDIS_DIR"
  if redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; then
    log "Redis already running on $REDIS_PORT"
    return
  fi
  redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --dir "$REDIS_DIR" --save "" --appendonly no \
    --daemonize yes --pidfile "$REDIS_DIR/redis.pid" --logfile "$REDIS_DIR/redis.log"
  for _ in $(seq 50); do redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
  redis-cli -p "$REDIS_PORT" ping >/dev/null || { log "Redis did not start: see $REDIS_DIR/redis.log"; exit 1; }
  log "Redis started on 127.0.0.1:$REDIS_PORT"
}

# Prometheus scrapes only what tests register: one JSON file per target group in $PROM_DIR/targets/ (job
# "dcgm", the simulator's dcgm-exporter stand-ins) or $PROM_DIR/targets-claimscope/ (job "claimscope", our own
# /metrics with the bearer token in $PROM_DIR/claimscope-token). A relabel rule drops every target that is
# not on loopback, so nothing a test writes can make it reach outside the machine. No remote write/read,
# no alerting, no admin API: the defaults of the package's systemd unit are not used.
write_prometheus_config() {
  mkdir -p "$PROM_DIR/targets" "$PROM_DIR/targets-claimscope" "$PROM_DIR/data"
  [ -f "$PROM_DIR/claimscope-token" ] || head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$PROM_DIR/claimscope-token"
  cat >"$PROM_DIR/prometheus.yml" <<CONF
global:
  scrape_interval: 2s
  scrape_timeout: 1s
  evaluation_interval: 2s
scrape_configs:
  - job_name: dcgm
    file_sd_configs:
      - files: ["$PROM_DIR/targets/*.json"]
        refresh_interval: 2s
    relabel_configs: &loopback_only
      - source_labels: [__address__]
        regex: '(127\\.0\\.0\\.1|localhost|\\[::1\\]):[0-9]+'
        action: keep
  - job_name: claimscope
    authorization:
      credentials_file: $PROM_DIR/claimscope-token
    file_sd_configs:
      - files: ["$PROM_DIR/targets-claimscope/*.json"]
        refresh_interval: 2s
    relabel_configs: *loopback_only
CONF
}

start_prometheus() {
  command -v prometheus >/dev/null || apt_install prometheus
  write_prometheus_config
  if curl -fsS "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1; then
    log "Prometheus already running on $PROM_PORT"
    return
  fi
  nohup prometheus --config.file="$PROM_DIR/prometheus.yml" --web.listen-address="127.0.0.1:$PROM_PORT" \
    --storage.tsdb.path="$PROM_DIR/data" --storage.tsdb.retention.time=2d \
    --web.console.templates=/dev/null --web.console.libraries=/dev/null \
    >"$PROM_DIR/prometheus.log" 2>&1 &
  echo $! >"$PROM_DIR/prometheus.pid"
  for _ in $(seq 100); do curl -fsS "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fsS "http://127.0.0.1:$PROM_PORT/-/ready" >/dev/null ||
    { log "Prometheus did not start: see $PROM_DIR/prometheus.log"; exit 1; }
  log "Prometheus started on 127.0.0.1:$PROM_PORT"
}

stop_all() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -n "$bin" ] && [ -f "$PG_DATA/PG_VERSION" ]; then
    as_pg "$bin/pg_ctl" -D "$PG_DATA" -m fast stop >/dev/null 2>&1 || true
  fi
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
  if [ -f "$PROM_DIR/prometheus.pid" ]; then
    kill "$(cat "$PROM_DIR/prometheus.pid")" 2>/dev/null || true
    rm -f "$PROM_DIR/prometheus.pid"
  fi
  log "stopped"
}

print_env() {
  echo "DATABASE_URL=postgres://claimscope@127.0.0.1:$PG_PORT/claimscope"
  echo "REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0"
  echo "PROMETHEUS_URL=http://127.0.0.1:$PROM_PORT"
}

case "${1:-start}" in
  start) start_pg; start_redis; start_prometheus; print_env ;;
  stop) stop_all ;;
  env) print_env ;;
  status)
    redis-cli -p "$REDIS_PORT" ping || true
    curl -fsS "http://127.0.0.1:$PROM_PORT/-/ready" || true
    bin=$(pg_bin); as_pg "$bin/pg_ctl" -D "$PG_DATA" status || true ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac
