#!/usr/bin/env bash
# Copy plotly.js from the installed plotly package into static/vendor/ (served by us: no CDN, machines may
# be offline). Run after upgrading plotly; the copied file is committed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
src=$("$PY" -c 'import pathlib, plotly; print(pathlib.Path(plotly.__file__).parent / "package_data" / "plotly.min.js")')
mkdir -p static/vendor
cp "$src" static/vendor/plotly.min.js
echo "static/vendor/plotly.min.js <- $src ($("$PY" -c 'import plotly; print(plotly.__version__)'))"
