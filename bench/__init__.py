"""pprobe's benchmark: overhead and throughput measured side by side with the peers.

``python -m bench`` (``--quick`` for the CI smoke run, ``--only NAME`` to pick workloads).
Every probed variant runs in a fresh subprocess started through pprobe's bootstrap; variants
of one workload are interleaved round by round. See docs/performance.md.

Peers run in the same rounds: torch.profiler, and msprobe (``pip install
mindstudio-probe==26.2.0``) on the torch MLP. msprobe is optional: without it its two variants
are reported ``unavailable`` and the rest of the benchmark runs as before.
"""
