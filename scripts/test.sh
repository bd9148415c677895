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

echo "== pytest"
mkdir -p .artifacts
set +e
$VENV/bin/pytest "$@"
status=$?
set -e
if [ $status -eq 5 ]; then
  echo "pytest collected no tests" >&2
  exit 1
fi
exit $status
