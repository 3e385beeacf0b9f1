"""Build the optional C speedups of the log (``framework.log._native``).

Everything else about the package lives in ``pyproject.toml``. The extension is optional:
when no C compiler is available the build goes on without it and the pure-Python
implementations in ``framework.log.partitioner`` and ``framework.log.batch`` are used.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "framework.log._native",
            ["framework/log/_native.c"],
            optional=True,
            extra_compile_args=["-O3"],
        )
    ]
)
