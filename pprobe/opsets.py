"""Sets of op names that the recording core and the analyses share (stdlib only: the core
imports it at start-up).

Patterns are globs over op names, matched like PPROBE_INCLUDE (the full name, or the last part
for a pattern without a dot).
"""

from __future__ import annotations

import fnmatch
import re

#: Ops whose inf outputs are expected. A fill or a selection whose inputs are finite can only
#: produce an inf from the value the program asked for (``masked_fill(mask, -inf)``,
#: ``np.full(n, -inf)``, ``np.where(m, x, -np.inf)``); ``log`` is expected only on a 0/1 mask
#: (``:mask``): ``log`` of probabilities that underflowed to 0 is a real origin.
DEFAULT_ALLOW: tuple[str, ...] = (
    "numpy.full",
    "numpy.full_like",
    "numpy.where",
    "numpy.ndarray.fill",
    "numpy.copyto",
    "numpy.putmask",
    "numpy.place",
    "numpy.log:mask",
    "numpy.ma.*",
    "torch.full",
    "torch.full_like",
    "torch.fill",
    "torch.fill_",
    "torch.where",
    "torch.masked_fill",
    "torch.Tensor.new_full",
    "torch.Tensor.fill_",
    "torch.Tensor.masked_fill",
    "torch.Tensor.masked_fill_",
    "torch.Tensor.where",
    "torch.log:mask",
    "torch.Tensor.log:mask",
    "aten.full.*",
    "aten.full_like.*",
    "aten.new_full.*",
    "aten.fill.*",
    "aten.fill_.*",
    "aten.masked_fill.*",
    "aten.masked_fill_.*",
    "aten.where.*",
    "aten.log.*:mask",
)
#: Ops whose outputs are uninitialised memory: a NaN or inf in them is noise, not an origin
#: (whatever fills them, such as ``uniform_``, takes that noise as its input and drops it).
UNINITIALISED: tuple[str, ...] = (
    "numpy.empty",
    "numpy.empty_like",
    "torch.empty",
    "torch.empty_like",
    "torch.empty_strided",
    "torch.Tensor.new_empty",
    "torch.Tensor.new_empty_strided",
    "aten.empty.*",
    "aten.empty_like.*",
    "aten.empty_strided.*",
    "aten.new_empty.*",
    "aten.new_empty_strided.*",
)


def matches(op: str, pattern: str) -> bool:
    """Whether the op name matches one glob of these sets (``:mask`` and the like cut off)."""
    pattern = pattern.partition(":")[0]
    if fnmatch.fnmatchcase(op, pattern):
        return True
    return "." not in pattern and fnmatch.fnmatchcase(op.rsplit(".", 1)[-1], pattern)


#: :data:`UNINITIALISED` as one regular expression (each op is checked once, when it is
#: created: one match instead of a glob per pattern; every pattern has a dot).
UNINITIALISED_RE = re.compile("|".join(fnmatch.translate(p) for p in UNINITIALISED))
