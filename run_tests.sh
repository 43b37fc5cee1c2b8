#!/usr/bin/env bash
# The test command (README.md): installs what the tests need, lints, type-checks, tests.
#   ./run_tests.sh              everything, once per engine (about 15 minutes on 2 cores)
#   ./run_tests.sh -k dumps     extra arguments go to pytest
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

echo "== installing pprobe (editable) with its test tools, torch==2.13.0 (CPU) and the frameworks"
# torch is pinned: a bare 'torch' would make pip download the CUDA build (GBs). lightning,
# transformers and accelerate (tests/test_integrations.py) sit next to the pin, so that pip
# resolves them against torch 2.13.0 and never replaces it.
"$PY" -m pip install -q --disable-pip-version-check -e ".[dev]" "torch==2.13.0" lightning transformers accelerate

echo "== ruff"
"$PY" -m ruff check pprobe bootstrap tests bench examples tools
"$PY" -m ruff format --check pprobe bootstrap tests bench examples tools
echo "== mypy"
"$PY" -m mypy
# The suite runs once per recording engine (pprobe/core.py): the native core, then its
# pure-Python twin. Extra arguments go to both runs.
"$PY" -c "import pprobe._native, pprobe._dumpio" 2>/dev/null || {
  echo "the native modules (pprobe/_native.c, pprobe/_dumpio.c) did not build: is a C compiler installed?" >&2
  exit 1
}
rc=0
for core in native python; do
  echo "== pytest (PPROBE_CORE=$core)"
  set +e
  PPROBE_CORE=$core "$PY" -m pytest -q -p no:cacheprovider "$@"
  r=$?
  set -e
  if [ "$r" -eq 5 ]; then
    echo "pytest collected no tests: that is a failure" >&2
    r=1
  fi
  [ "$r" -eq 0 ] || rc=$r
done
exit "$rc"
