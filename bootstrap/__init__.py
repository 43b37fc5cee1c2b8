# This folder goes on PYTHONPATH; it is also installed as the package data pprobe._bootstrap.
