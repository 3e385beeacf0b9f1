"""Facts about the host this process runs on."""

from __future__ import annotations

import time
from pathlib import Path

try:  # the module hashlib takes blake2b from, without loading OpenSSL (start-up time)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover - an interpreter built without it
    from hashlib import blake2b

__all__ = ["BOOT"]


def _boot_hash() -> int:
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = str(round(time.time() - time.monotonic(), -1))
    return int.from_bytes(blake2b(boot.encode(), digest_size=8).digest(), "little")


BOOT = _boot_hash()
"""A hash of this boot of the machine: memory-mapped state of another boot is stale."""
