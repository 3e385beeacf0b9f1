"""Build the optional C speedups (``eventlane.log._native``, ``eventlane.kafka._wire``,
``eventlane.codec._seal``).

Everything else about the package lives in ``pyproject.toml``. The extension is optional:
when no C compiler is available the build goes on without it and the pure-Python
implementations in ``eventlane.log.partitioner``, ``eventlane.log.embedded.batch``,
``eventlane.kafka.records`` and ``eventlane.codec.privacy`` are used (``_seal`` also needs
OpenSSL's headers: Debian's libssl-dev, which ``make`` installs; with libsodium's headers,
Debian's libsodium-dev, which ``make`` installs too, it opens AES-256-GCM through libsodium).
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import Extension, setup


def _sodium() -> bool:
    """Whether libsodium's headers are here (pkg-config, or Debian's include path)."""
    if shutil.which("pkg-config"):
        found = subprocess.run(["pkg-config", "--exists", "libsodium"], check=False)
        if found.returncode == 0:
            return True
    return Path("/usr/include/sodium.h").exists()


SODIUM = _sodium()

setup(
    ext_modules=[
        Extension(
            "eventlane.log._native",
            ["eventlane/log/_native.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(  # the Kafka listener's Fetch framing (eventlane.kafka.records)
            "eventlane.kafka._wire",
            ["eventlane/kafka/_wire.c"],
            optional=True,
            extra_compile_args=["-O3"],
        ),
        Extension(  # opening a sealed event's cipher object (eventlane.codec.privacy)
            "eventlane.codec._seal",
            ["eventlane/codec/_seal.c"],
            optional=True,
            libraries=["crypto", "sodium"] if SODIUM else ["crypto"],
            define_macros=[("HAVE_SODIUM", "1")] if SODIUM else [],
            extra_compile_args=["-O3"],
        ),
    ]
)
