"""Build the optional C speedups (``framework.log._native``, ``framework.kafka._wire``,
``framework.codec._seal``).

Everything else about the package lives in ``pyproject.toml``. The extension is optional:
when no C compiler is available the build goes on without it and the pure-Python
implementations in ``framework.log.partitioner``, ``framework.log.embedded.batch``,
``framework.kafka.records`` and ``framework.codec.privacy`` are used (``_seal`` also needs
OpenSSL's headers: Debian's libssl-dev, which ``make`` installs).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "framework.log._native",
            ["framework/log/_native.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(  # the Kafka listener's Fetch framing (framework.kafka.records)
            "framework.kafka._wire",
            ["framework/kafka/_wire.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(  # opening a sealed event's cipher object (framework.codec.privacy)
            "framework.codec._seal",
            ["framework/codec/_seal.c"],
            optional=True,
            libraries=["crypto"],
            extra_compile_args=["-O3"],
        ),
    ]
)
