"""Many hosts, one log: stream every process's log batches to a collector over Arrow Flight.

- :mod:`.server`: ``pprobe collect``, the Flight server that writes run folders.
- :mod:`.client`: the sender a probed process starts when ``PPROBE_COLLECTOR`` is set.
- :mod:`.spool`: the bounded local folder batches wait in while the collector is away.
- :mod:`.breaker`: the circuit breaker and the retry backoff.
- :mod:`.cli`: the command line.

Nothing here is imported at start-up: the client only when ``PPROBE_COLLECTOR`` is set.
"""
