"""Builds pprobe's optional native modules with the system compiler: the recording core
(pprobe/_native.c), the dump writer and statistics (pprobe/_dumpio.c) and the C-level SIGTERM
handler (pprobe/_sigterm.c).

``optional=True``: without a compiler, or on an interpreter the core does not support, the
install still succeeds and pprobe runs its pure-Python twins (pprobe/core.py says why).
Everything else about the package is declared in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "pprobe._native",
            ["pprobe/_native.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wno-missing-field-initializers"],
        ),
        Extension(
            "pprobe._dumpio",
            ["pprobe/_dumpio.c"],
            optional=True,
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-pthread"],
            extra_link_args=["-pthread"],
        ),
        # Flush on SIGTERM without a Python-level handler (pprobe/session.py).
        Extension(
            "pprobe._sigterm",
            ["pprobe/_sigterm.c"],
            optional=True,
            extra_compile_args=["-O2", "-Wall"],
        ),
    ]
)
