#!/usr/bin/env bash
# The interpreter and NumPy matrix (.ci/run calls it after the main tests, which run on the
# default Python with torch). For each CPython below that this machine has (pyenv's, or
# pythonX.Y on PATH): a venv, pprobe installed from a copy of this tree (which builds the
# native core for that interpreter: a core that did not build fails the job), the NumPy of
# the job, pytest; then a fast subset of pprobe's non-torch tests once per engine.
#
#   .ci/matrix.sh                 every job
#   .ci/matrix.sh 3.12            the jobs of these versions
#   MATRIX_DIR=/tmp/m .ci/matrix.sh   keep the venvs there (reused by the next call)
#
# Jobs: 3.10 with the oldest NumPy pprobe claims (2.0), 3.12 and 3.13 with the newest it
# claims (2.4); 3.13 also runs NumPy's own test slice (tools/numpy_suite.py --slice) with
# and without the probe. A version this machine lacks is reported and skipped, not failed.
set -euo pipefail
# All in one function: bash has read the whole file before any of it runs.
main() {
cd "$(dirname "$0")/.."
REPO=$(pwd)
if [ -n "${MATRIX_DIR:-}" ]; then
  WORK=$MATRIX_DIR
  mkdir -p "$WORK"
else
  WORK=$(mktemp -d -t pprobe-matrix.XXXXXX)
  trap 'rm -rf "$WORK"' EXIT  # the venvs: about 400 MB each
fi

# The range README claims (pyproject only asks numpy>=2.0, so that installing pprobe never
# downgrades a newer NumPy): bump NEWEST_NUMPY when a newer one passes here.
OLDEST_NUMPY="numpy==2.0.0"
NEWEST_NUMPY="numpy==2.4.6"
#        version  numpy          extra
JOBS=("3.10 $OLDEST_NUMPY -"
      "3.12 $NEWEST_NUMPY -"
      "3.13 $NEWEST_NUMPY suite")

# The fast subset (about 1.5 minutes per engine here): start-up and children (bootstrap,
# config, other interpreters), the two engines, operators and transparency, rows and their
# files. Left to the main run: query, dumps, stress, CPython slot internals, small-int
# references and torch.
TESTS=(tests/test_bootstrap.py tests/test_config.py tests/test_interpreters.py
       tests/test_children.py tests/test_core.py tests/test_numpy_operators.py
       tests/test_transparency.py tests/test_recording.py tests/test_log.py
       tests/test_step_at.py tests/test_flush_window.py tests/test_async_exceptions.py)

find_python() {  # 3.12 -> a CPython 3.12 with the GIL on this machine, or nothing
  local v=$1 p
  for p in "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$v".*/bin/python "$(command -v "python$v" || true)"; do
    [ -n "$p" ] && [ -x "$p" ] || continue
    if "$p" -c "import sys, sysconfig; sys.exit(sys.implementation.name != 'cpython' or bool(sysconfig.get_config_var('Py_GIL_DISABLED')))" 2>/dev/null; then
      echo "$p"
      return
    fi
  done
}

# One copy of the tree for every job: each interpreter builds its own pprobe/_native.*.so in
# it (the ABI tag tells them apart), and this checkout stays as it is.
SRC="$WORK/src"
rm -rf "$SRC"
mkdir -p "$SRC"
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$SRC"

want=("$@")
rc=0
summary=()
for job in "${JOBS[@]}"; do
  read -r version numpy extra <<<"$job"
  if [ ${#want[@]} -gt 0 ] && [[ " ${want[*]} " != *" $version "* ]]; then
    continue
  fi
  start=$SECONDS
  py=$(find_python "$version")
  if [ -z "$py" ]; then
    echo "== matrix: no CPython $version on this machine: skipped"
    summary+=("$version: skipped (not installed)")
    continue
  fi
  venv="$WORK/venv-$version"
  echo "== matrix: CPython $version ($py), $numpy"
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  vpy="$venv/bin/python"
  local more=()
  [ "$extra" = suite ] && more=("hypothesis>=6")  # NumPy's own tests need it
  "$vpy" -m pip install -q --disable-pip-version-check -e "$SRC" "$numpy" "pytest>=8" \
    "tomli>=1.1" "${more[@]}"
  # The native core is optional at install time (no compiler: the Python engine runs); here
  # it must have built for this interpreter.
  (cd "$SRC" && "$vpy" -c "
import sys, numpy, pprobe, pprobe._native
from pprobe import core
print('   python', sys.version.split()[0], 'numpy', numpy.__version__, 'engine', core.ENGINE,
      '(' + core.REASON + ')')
assert core.ENGINE == 'native', core.REASON
") || { echo "the native core did not build or load on CPython $version" >&2; rc=1; continue; }
  status=ok
  # The two engines' runs side by side (the tests wait mostly on the subprocesses they
  # start, one core each), each into its log, shown when both have ended.
  local pids=() engine r
  for engine in native python; do
    (cd "$SRC" && PPROBE_CORE=$engine "$vpy" -m pytest -q -p no:cacheprovider -m "not slow" \
       --basetemp="$WORK/tmp-$version-$engine" "${TESTS[@]}") >"$WORK/log-$version-$engine" 2>&1 &
    pids+=($!)
  done
  for engine in native python; do
    set +e
    wait "${pids[0]}"
    r=$?
    set -e
    pids=("${pids[@]:1}")
    echo "== matrix: CPython $version, PPROBE_CORE=$engine"
    cat "$WORK/log-$version-$engine"
    if [ "$r" -ne 0 ]; then status="FAILED ($engine: pytest exit $r)"; rc=1; fi
  done
  if [ "$extra" = suite ]; then
    echo "== matrix: CPython $version, NumPy's test slice with and without the probe"
    set +e
    (cd "$SRC" && "$vpy" -m pytest -q -p no:cacheprovider tests/test_numpy_suite_slice.py)
    r=$?
    set -e
    if [ "$r" -ne 0 ]; then status="FAILED (numpy suite slice: pytest exit $r)"; rc=1; fi
  fi
  summary+=("$version ($("$vpy" -c 'import numpy; print("numpy", numpy.__version__)')): $status in $((SECONDS - start)) s")
done
echo "== matrix summary"
printf '   %s\n' "${summary[@]}"
return "$rc"
}
main "$@"
