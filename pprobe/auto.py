"""``import pprobe.auto`` starts the probe, exactly as the bootstrap does."""

from ._startup import initialize

initialize(source="bootstrap")
