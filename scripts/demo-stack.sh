#!/usr/bin/env bash
# make demo-stack: the production topology on this machine, with the simulator as the cluster.
#   PostgreSQL + Redis (scripts/services.sh), the simulated cluster behind the Kubernetes API
#   (manage.py simulate) with its dcgm-exporter stand-in scraped by the real Prometheus, Celery workers for
#   the watch, default and diagnosis queues, beat (utilization sampling included), and the ASGI server.
# Ctrl-C stops every process it started.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
export CLAIMSCOPE_DATA_DIR=${CLAIMSCOPE_DATA_DIR:-$PWD/.run/stack}
mkdir -p "$CLAIMSCOPE_DATA_DIR/logs"
LOGS=$CLAIMSCOPE_DATA_DIR/logs

service_env=$(scripts/services.sh start)
eval "$(sed 's/^/export /' <<<"$service_env")"
: "${DATABASE_URL:?}" "${REDIS_URL:?}" "${PROMETHEUS_URL:?}"
# Production settings want a key and https; this stack is local plain http.
if [ ! -s "$CLAIMSCOPE_DATA_DIR/secret_key" ]; then
  (umask 077; head -c 48 /dev/urandom | base64 | tr -d '\n' >"$CLAIMSCOPE_DATA_DIR/secret_key")
fi
SECRET_KEY=$(cat "$CLAIMSCOPE_DATA_DIR/secret_key")
export SECRET_KEY SECURE_COOKIES=0
# Production serves collected static files (WhiteNoise), as the container image does.
export STATIC_ROOT=$CLAIMSCOPE_DATA_DIR/static

pids=()
cleanup() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -f "${DCGM_TARGETS:-/nonexistent}/demo-stack.json"
  wait 2>/dev/null || true
  echo "demo-stack stopped (logs in $LOGS)"
}
trap cleanup INT TERM EXIT

$PY manage.py migrate -v0
$PY manage.py collectstatic --noinput -v0
KUBECONFIG_FILE=$CLAIMSCOPE_DATA_DIR/simulator.kubeconfig
rm -f "$KUBECONFIG_FILE"
# The stand-in registers itself as a scrape target of the running Prometheus (its file_sd folder is read
# from that Prometheus's configuration: it may have been started from another checkout).
DCGM_TARGETS=$(curl -fsS "$PROMETHEUS_URL/api/v1/status/config" | $PY -c \
  'import json, sys, yaml, os; c = yaml.safe_load(json.load(sys.stdin)["data"]["yaml"]); j = [j for j in c["scrape_configs"] if j["job_name"] == "dcgm"][0]; print(os.path.dirname(j["file_sd_configs"][0]["files"][0]))')
$PY manage.py simulate --kubeconfig "$KUBECONFIG_FILE" --dcgm-port 0 \
  --dcgm-target-file "$DCGM_TARGETS/demo-stack.json" >"$LOGS/simulate.log" 2>&1 &
pids+=($!)
for _ in $(seq 120); do [ -s "$KUBECONFIG_FILE" ] && break; sleep 0.5; done
[ -s "$KUBECONFIG_FILE" ] || { echo "the simulator did not start: see $LOGS/simulate.log"; exit 1; }
export CLAIMSCOPE_CLUSTERS="demo=kubeconfig:$KUBECONFIG_FILE"
export CLAIMSCOPE_PROMETHEUS="demo=$PROMETHEUS_URL;label=run:demo-stack"
# Forget a previous run's mirror: the new simulated cluster's versions start over.
$PY -c "import django; django.setup(); from fleet import ingest; ingest.drop_cluster('demo')" \
  2>/dev/null || true
password=$($PY manage.py demo_login)

.venv/bin/celery -A dashboard worker -Q watch -P threads -c 16 -n watch@%h >"$LOGS/worker-watch.log" 2>&1 &
pids+=($!)
.venv/bin/celery -A dashboard worker -Q celery -c 2 -n default@%h >"$LOGS/worker-default.log" 2>&1 &
pids+=($!)
.venv/bin/celery -A dashboard worker -Q diagnosis -P threads -c 4 -n diagnosis@%h >"$LOGS/worker-diagnosis.log" 2>&1 &
pids+=($!)
.venv/bin/celery -A dashboard beat -s "$CLAIMSCOPE_DATA_DIR/celerybeat-schedule" >"$LOGS/beat.log" 2>&1 &
pids+=($!)
echo "claimscope demo-stack: http://$HOST:$PORT/  login: demo / $password  (logs: $LOGS)"
.venv/bin/uvicorn dashboard.asgi:application --host "$HOST" --port "$PORT" --no-proxy-headers &
pids+=($!)
wait -n "${pids[@]}"
