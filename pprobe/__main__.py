"""``python -m pprobe ...`` is the pprobe command line."""

from .cli import main

raise SystemExit(main())
