"""What a sealed event costs to open, counted in instructions (load-independent; issue 36
item 5).

    python benchmarks/instructions_seal.py [--figure open decode] [--repeat 3]
        [--small 200] [--large 1000] [--records 1000]

valgrind's callgrind counts the user-space instructions a process executes, the same at any
load. Each figure runs in a fresh process under callgrind twice, with ``small`` and
``large`` operations; instructions per operation = the difference / (large - small): the
start-up, the records' encoding and a first pass that opens every key (the same in both
runs) cancel out. ``--records`` events are encoded and operated on in turn (cycling when
there are more operations): ``--records 2000 --small 2000 --large 12000`` differences 10,000
decodes, which GC passes and time-dependent work disturb less than the default 800. Events are ``bench_privacy.py``'s (``name`` and ``city`` personal,
``plan`` in clear), 10 per subject, 100 subjects, keys in a real :class:`LogKeyStore` whose
cache stays fresh, so the C call is used when it is built. Configurations:

* ``plain``: the same events with no personal field (``decode`` only: the baseline);
* ``sodium``: ``eventlane/codec/_seal.c`` with libsodium's precomputed AES-256-GCM state
  (``crypto_aead_aes256gcm_decrypt_afternm``);
* ``openssl``: the same C call through an OpenSSL EVP context per key;
* ``python``: no C call (``FieldCipher.open`` with ``cryptography``'s AES-GCM).

Figures: ``open`` (``FieldCipher.open4``, or ``open`` for ``python``, of one event's
already parsed data) and ``decode`` (``EventCodec.decode(..., lazy=True)`` of a stored
record, what a projector worker does per event). Needs ``valgrind`` (Debian package).
"""

from __future__ import annotations

import argparse
import statistics

from _callgrind import count_child

SMALL, LARGE = 200, 1000
CONFIGS = {
    "open": ("sodium", "openssl", "python"),
    "decode": ("plain", "sodium", "openssl", "python"),
}
CHILD = r"""
import functools, sys, tempfile
from pathlib import Path
import orjson
sys.path.insert(0, "benchmarks")
figure, config, n, total = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
from eventlane.codec import Envelope, EventCodec, EventRegistry, privacy
if config == "python":
    privacy._Opener = None
elif config != "plain":
    from eventlane.codec import _seal
    privacy._Opener = functools.partial(_seal.Opener, engine=config)
from eventlane.codec.keystore import LogKeyStore
from eventlane.log.embedded.store import LogStore
import bench_privacy as b
cls, agg = (b.PlainJoined, b.PlainMember) if config == "plain" else (b.SealedJoined, b.SealedMember)
registry = EventRegistry()
registry.register(cls)
registry.register_aggregate(agg)
log = LogStore(Path(tempfile.mkdtemp()))
codec = EventCodec(registry, keys=LogKeyStore(log, refresh_ms=600_000))
records = [
    codec.encode(Envelope(cls(f"Name {i}", "Oslo", "basic"), f"m{i // 10:05d}", i % 10 + 1))
    for i in range(total)
]
for r in records:  # every key opened, the readers built
    codec.decode(*r, lazy=True)
if figure == "decode":
    decode = codec.decode
    for i in range(n):
        decode(*records[i % total], lazy=True)
else:
    docs = [orjson.loads(records[i % total][1]) for i in range(n)]
    cipher, none = codec._cipher, frozenset()
    if config == "python":
        for d in docs:
            cipher.open(d["data"], d["event_id"], None, None, None, d["aggregate_id"], none)
    else:
        open4 = cipher.open4
        for d in docs:
            assert open4(d["data"], d["event_id"], d["aggregate_id"], none)
log.close()
"""


def instructions(figure: str, config: str, n: int, records: int) -> int:
    """User-space instructions of one child process doing ``n`` operations."""
    return count_child(CHILD, figure, config, str(n), str(records))


def per_operation(figure: str, config: str, small: int, large: int, records: int) -> float:
    counts = [instructions(figure, config, n, records) for n in (large, small)]
    return (counts[0] - counts[1]) / (large - small)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figure", nargs="+", choices=sorted(CONFIGS), default=["open", "decode"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--small", type=int, default=SMALL)
    parser.add_argument("--large", type=int, default=LARGE)
    parser.add_argument("--records", type=int, default=LARGE)
    args = parser.parse_args()
    for figure in args.figure:
        per: dict[str, list[float]] = {config: [] for config in CONFIGS[figure]}
        for _ in range(args.repeat):
            for config, counts in per.items():
                counts.append(per_operation(figure, config, args.small, args.large, args.records))
        base = statistics.median(per[CONFIGS[figure][0]])
        for config, counts in per.items():
            mid = statistics.median(counts)
            print(
                f"{figure} {config}: {mid:,.0f} instructions an event"
                f" ({mid / base:.3f}x of {CONFIGS[figure][0]}, +{mid - base:,.0f};"
                f" range {min(counts):,.0f}-{max(counts):,.0f}, {args.repeat} runs)",
                flush=True,
            )


if __name__ == "__main__":
    main()
