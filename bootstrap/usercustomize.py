"""pprobe bootstrap (usercustomize: venvs skip it, so sitecustomize.py does the same)."""

import _pprobe_boot

_pprobe_boot.boot("usercustomize")
