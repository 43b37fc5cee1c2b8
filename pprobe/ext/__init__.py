"""The extension layer: user tables, metrics, hooks, settings, plugins and live SQL.

Nothing here is imported into a probed program until the program uses it (``pprobe``'s module
``__getattr__`` loads these names on first use). Layout, one concern per module:

- :mod:`pprobe.ext.tables`: the registry of ``@table`` / ``@metric`` / ``record``, sampling,
  and the streamed shards ``log/python/{table}-{host}-{pid}-{k}.arrows``;
- :mod:`pprobe.ext.sqlviews`: reading those shards back as DuckDB's schema ``python``, and the
  ``settings`` tables;
- :mod:`pprobe.ext.hooks`: ``register_hook`` and ``hook_function`` with their circuit breaker;
- :mod:`pprobe.ext.plugins`: ``Plugin``, loading and unloading;
- :mod:`pprobe.ext.live`: ``pprobe.sql`` in process;
- :mod:`pprobe.ext.cli`: the ``pprobe plugins`` command.
"""
