#!/usr/bin/env bash
# Runs the shipped examples under the probe and prints what the log says about them.
# Usage: ./run_examples.sh            (installs pprobe's dependencies first if they are missing)
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}

if ! "$PY" -c "import numpy, wrapt, pyarrow, duckdb" 2>/dev/null; then
  echo "== installing pprobe and its dependencies (pip install -e .)"
  "$PY" -m pip install -q -e .
fi

OUT=${PPROBE_OUTPUT:-np_op_dumps}
export PPROBE_OUTPUT=$OUT
unset PPROBE_RESOLVED

echo "== examples/numpy_mlp.py under the probe (dump mode: log + statistics + .npy dumps)"
PYTHONPATH=bootstrap "$PY" examples/numpy_mlp.py
echo
echo "== which ops did it run? (pprobe query)"
"$PY" -m pprobe query "SELECT op, kind, count(*) AS calls, round(sum(dur_ns)/1e6, 3) AS ms
                       FROM ops GROUP BY op, kind ORDER BY calls DESC, op LIMIT 15"
echo
npys=$(find "$OUT/latest/" -maxdepth 1 -name '*.npy' | sort)
echo "== dumps in $OUT/latest/: $(echo "$npys" | wc -l) .npy files, e.g."
echo "$npys" | head -n 3 | sed 's|.*/||' || true

echo
echo "== examples/nan_loss.py under the probe (stats mode): where was the NaN born?"
PYTHONPATH=bootstrap PPROBE_MODE=stats "$PY" examples/nan_loss.py | tail -3
echo
echo "== pprobe nan: the origin (log(0) -> -inf) and what carried it on (0 * -inf -> NaN)"
rc=0
"$PY" -m pprobe nan || rc=$?
if [ "$rc" -ne 1 ]; then  # 1: an origin was found, as it must be here
  echo "pprobe nan exited $rc, expected 1" >&2
  exit 1
fi

echo
echo "== examples/precision_mlp.py in float64, then float32: where do the two runs part? (pprobe compare)"
PYTHONPATH=bootstrap PRECISION=float64 "$PY" examples/precision_mlp.py
golden=$(cat "$OUT/LATEST")
PYTHONPATH=bootstrap PRECISION=float32 "$PY" examples/precision_mlp.py 2>/dev/null
# exit status 1: the runs diverge (examples/test_compare_golden.py uses it as a pytest check)
"$PY" -m pprobe compare "$golden" latest --top 5 || echo "(pprobe compare exit status $?: divergent)"

echo
echo "== examples/ext_demo.py: a table, a metric, a hook and a plugin (docs/extending.md)"
PYTHONPATH=bootstrap:examples PPROBE_PLUGINS=ext_plugin PPROBE_MODE=log "$PY" examples/ext_demo.py
echo "-- the table (@table, sampled at each step boundary and at exit)"
"$PY" -m pprobe query "SELECT step, steps_done, round(loss, 4) AS loss
                       FROM python.training_state ORDER BY step LIMIT 4"
echo "-- the metrics (@metric, and the plugin's)"
"$PY" -m pprobe query "SELECT name, count(*) AS samples, round(min(value), 4) AS min,
                       round(max(value), 4) AS max FROM python.metrics GROUP BY name ORDER BY name"
echo "-- the hook's rows (hook_function + pprobe.record)"
"$PY" -m pprobe query "SELECT i, round(loss, 4) AS loss FROM python.losses ORDER BY i LIMIT 3"
echo "-- the plugin's table and the settings"
"$PY" -m pprobe query "SELECT count(*) AS rows, round(sum(seconds), 3) AS seconds
                       FROM python.step_times"
"$PY" -m pprobe query "SELECT name, value, source FROM information_schema.df_settings
                       WHERE name LIKE 'demo.%' OR name LIKE 'timing.%' ORDER BY name"
PPROBE_PLUGINS=ext_plugin PYTHONPATH=examples "$PY" -m pprobe plugins

if "$PY" -c "import torch" 2>/dev/null && [ -f examples/torch_mlp.py ]; then
  echo
  echo "== examples/torch_mlp.py under the probe (log mode, module paths, optimizer steps)"
  PYTHONPATH=bootstrap PPROBE_MODE=log "$PY" examples/torch_mlp.py
  "$PY" -m pprobe query "SELECT module_path, op, count(*) AS calls FROM ops
                         WHERE framework = 'torch' GROUP BY ALL ORDER BY calls DESC LIMIT 10"
  echo
  echo "== examples/hooks/hooks_loop.py: lifecycle hooks from examples/hooks/pprobe.toml (docs/hooks.md)"
  PYTHONPATH=bootstrap PPROBE_CONFIG=examples/hooks/pprobe.toml "$PY" examples/hooks/hooks_loop.py
  "$PY" -m pprobe query "SELECT step, round(ms, 2) AS ms, lr FROM python.hook_steps ORDER BY step"
  "$PY" -m pprobe query "SELECT phase, count(*) AS calls FROM ops GROUP BY phase ORDER BY calls DESC"
else
  echo
  echo "== torch is not installed: skipping examples/torch_mlp.py (pip install torch==2.13.0)"
fi

if "$PY" -c "import lightning.pytorch" 2>/dev/null || "$PY" -c "import pytorch_lightning" 2>/dev/null; then
  echo
  echo "== examples/lightning_run.py: an unchanged Lightning run; the hook of examples/lightning_plugin.py"
  echo "   is called at Lightning's boundaries (docs/integrations.md)"
  PYTHONPATH=bootstrap:examples PPROBE_PLUGINS=lightning_plugin PPROBE_MODE=log PYTHONWARNINGS=ignore \
    "$PY" examples/lightning_run.py 2>/dev/null
  echo "-- the op rows carry Lightning's global step (steps 3, 6: validation after each epoch)"
  "$PY" -m pprobe query "SELECT step, count(*) AS ops FROM ops WHERE framework = 'torch'
                         GROUP BY step ORDER BY step LIMIT 7"
  echo "-- the hook's rows: each epoch's trainer.callback_metrics"
  "$PY" -m pprobe query "SELECT epoch, steps, round(train_loss_epoch, 4) AS train_loss,
                         round(val_loss, 4) AS val_loss FROM python.epochs ORDER BY epoch"
else
  echo
  echo "== lightning is not installed: skipping examples/lightning_run.py (pip install lightning)"
fi

if "$PY" -c "import torch" 2>/dev/null; then
  echo
  echo "== examples/hooks_builtin.py: the built-in hooks and the CSV exporter (docs/hooks-builtin.md)"
  PYTHONPATH=bootstrap PPROBE_MODE=log "$PY" examples/hooks_builtin.py
  "$PY" -m pprobe query "SELECT step, round(duration_s * 1000, 2) AS ms, round(samples_per_s) AS samples_per_s,
                         round(eta_s, 3) AS eta_s FROM python.time_tracking WHERE event = 'step'
                         ORDER BY step LIMIT 4"
  "$PY" -m pprobe query "SELECT param, count(*) AS steps, round(avg(norm), 4) AS mean_norm,
                         round(max(max_abs), 4) AS max_abs, round(avg(zero_frac), 3) AS zero_frac,
                         sum(nan_count + inf_count) AS nonfinite
                         FROM python.gradient_flow GROUP BY param ORDER BY param"
  "$PY" -m pprobe query "SELECT module, step, round(mean, 4) AS mean, round(zero_frac, 3) AS zero_frac,
                         image FROM python.feature_maps ORDER BY step, module"
  "$PY" -m pprobe query "SELECT event, step, epoch, round(cpu_percent) AS cpu_percent,
                         rss_bytes // 1048576 AS rss_mib FROM python.system_monitor ORDER BY ts_ns"
  head -n 4 "$OUT/latest/logs/metrics.csv"
fi
