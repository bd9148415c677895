#!/usr/bin/env bash
# The whole check, as `make test` runs it: services, lint, types, tests. Installs what it needs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv

echo "== services (PostgreSQL, Redis)"
# Not eval "$(…)": a failing command substitution would be ignored and tests would run on SQLite.
service_env=$(scripts/services.sh start)
eval "$(sed 's/^/export /' <<<"$service_env")"
: "${DATABASE_URL:?services.sh did not provide DATABASE_URL}" "${REDIS_URL:?services.sh did not provide REDIS_URL}"
: "${PROMETHEUS_URL:?services.sh did not provide PROMETHEUS_URL}"
# The production configuration (PostgreSQL, Redis) with a throw-away key; plain http for the browser.
export SECRET_KEY="test-$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
export SECURE_COOKIES=0

if [ -f tests/controlplane/build.sh ]; then
  echo "== Kubernetes control plane (built from the upstream Go modules; cached)"
  bash tests/controlplane/build.sh
fi

if ! command -v chromium >/dev/null; then
  echo "== Chromium (Debian package) for browser tests"
  if [ "$(id -u)" = 0 ]; then
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  else
    echo "Chromium is missing: apt-get install chromium" >&2; exit 1
  fi
fi

echo "== ruff"
$VENV/bin/ruff check .
$VENV/bin/ruff format --check .
echo "== mypy"
$VENV/bin/mypy .
echo "== layering (import-linter contracts in pyproject.toml)"
$VENV/bin/lint-imports

# Pages, API, websockets, triage and security run on both databases: PostgreSQL (production) in the first
# pass, then SQLite with the in-memory channel layer (the embedded default `make demo` runs) in a second.
BOTH_DATABASES=(tests/api tests/fleet_pages tests/pending tests/security tests/triage tests/browser tests/usage)

run_pytest() {
  set +e
  "$@"
  local status=$?
  set -e
  if [ $status -eq 5 ]; then
    echo "pytest collected no tests" >&2
    return 1
  fi
  return $status
}

sqlite_pass() {
  local data
  data=$(mktemp -d)
  run_pytest env -u DATABASE_URL -u REDIS_URL CLAIMSCOPE_TEST_DATABASE=sqlite CLAIMSCOPE_DATA_DIR="$data" \
    $VENV/bin/pytest -m "not postgresql" -p no:cacheprovider "$@"
  local status=$?
  rm -rf "$data"
  return $status
}

mkdir -p .artifacts
if [ $# -gt 0 ]; then
  # One pass, on the database CLAIMSCOPE_TEST_DATABASE names (PostgreSQL unless it says sqlite).
  if [ "${CLAIMSCOPE_TEST_DATABASE:-postgresql}" = sqlite ]; then
    echo "== pytest on SQLite"
    sqlite_pass "$@"
  else
    echo "== pytest on PostgreSQL"
    run_pytest $VENV/bin/pytest "$@"
  fi
  exit $?
fi

echo "== pytest on PostgreSQL (everything)"
status=0
run_pytest env CLAIMSCOPE_TEST_DATABASE=postgresql $VENV/bin/pytest || status=$?
echo "== pytest on SQLite (the embedded default): ${BOTH_DATABASES[*]}"
sqlite_pass "${BOTH_DATABASES[@]}" || status=$?
exit $status
