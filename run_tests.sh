#!/usr/bin/env bash
# The test command (README.md): installs what the tests need, lints, type-checks, tests.
#   ./run_tests.sh              everything (about 5 minutes on 2 cores)
#   ./run_tests.sh -k dumps     extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

echo "== installing pprobe (editable) with its test tools, and torch==2.13.0 (CPU)"
# torch is pinned: a bare 'torch' would make pip download the CUDA build (GBs).
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev]" "torch==2.13.0"

echo "== ruff"
"$PY" -m ruff check pprobe bootstrap tests bench examples
"$PY" -m ruff format --check pprobe bootstrap tests bench examples
echo "== mypy"
"$PY" -m mypy
echo "== pytest"
set +e
"$PY" -m pytest -q -p no:cacheprovider "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: that is a failure" >&2
  exit 1
fi
exit "$rc"
