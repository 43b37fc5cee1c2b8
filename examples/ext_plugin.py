"""A pprobe plugin: load it with PPROBE_PLUGINS=ext_plugin (this folder on PYTHONPATH).

It registers a setting, a table sampled at step boundaries, and a metric; ``pprobe plugins``
lists it, and unloading it (``pprobe.unload_plugin("timing")``) removes all three.
"""

import time

from pprobe import Plugin


class TimingPlugin(Plugin):
    name = "timing"

    def on_load(self):
        self.every = self.register_setting("timing.every", default=1, type=int,
                                           help="keep one step in N")  # fmt: skip
        self.t0 = self.last = time.perf_counter()
        self.register_table("step_times", self.step_time)
        self.metric("wall_seconds", lambda: time.perf_counter() - self.t0)

    def step_time(self):
        now = time.perf_counter()
        row = {"seconds": now - self.last}
        self.last = now
        return row
