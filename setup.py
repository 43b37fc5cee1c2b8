"""Builds pprobe's optional native recording core (pprobe/_native.c) with the system compiler.

``optional=True``: without a compiler, or on an interpreter the core does not support, the
install still succeeds and pprobe runs its pure-Python engine (pprobe/core.py says why).
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
        )
    ]
)
