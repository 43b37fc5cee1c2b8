"""pprobe bootstrap: ``PYTHONPATH=bootstrap python prog.py`` probes prog.py (see README)."""

import _pprobe_boot

_pprobe_boot.boot("sitecustomize")
