"""The power-loss crash-state explorer (in the spirit of ALICE, CrashMonkey and LazyFS).

1. **Record**: run :mod:`tests.powerloss.workload` under ``strace`` (:mod:`.trace`), giving
   every file-system call on the data directory, SQLite's included, and the workload's
   acknowledgements in the same order.
2. **Model**: replay the calls in :class:`~.crashfs.Replay`, which knows at every point what
   is durable under ext4 ``data=ordered`` (see :mod:`.crashfs` for the exact rules).
3. **Crash points**: every acknowledgement and every fsync of the trace is a candidate (just
   before and just after a barrier are the interesting instants); a bounded, seeded sample is
   taken, always including the first, the last, and each kind of operation in between.
4. **States**: at each crash point, :func:`~.crashfs.crash_states` draws states (all unsynced
   changes lost, all kept, and random mixes of dropped, torn and reordered pages and lost
   directory entries); each partition's memory-mapped ``state`` is set to a copy it held
   before the crash, zeros, or left out, and always marked as written before a reboot.
5. **Check**: each state is written to a fresh directory, recovered with eventlane (open the
   log, read everything, verify, load aggregates, open the read model and the group's
   offsets) and compared with the acknowledgements by :mod:`.oracle`.

:func:`explore` returns :class:`Figures`; ``benchmarks/soak_powerloss.py`` runs it big.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from eventlane.log.embedded.state import BOOT
from tests.powerloss import crashfs, oracle, trace

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Failure:
    state: str
    problems: list[str]
    kept: Path | None = None


@dataclass
class Figures:
    ops: int = 0
    acks: int = 0
    fsyncs: int = 0
    crash_points: int = 0
    relayed_points: int = 0
    """Crash points chosen at the relay process's barriers (:func:`_relayed`)."""
    states: int = 0
    failures: list[Failure] = field(default_factory=list)
    record_s: float = 0.0
    explore_s: float = 0.0

    def summary(self) -> str:
        return (
            f"{self.ops} traced ops ({self.fsyncs} fsyncs, {self.acks} acknowledgements), "
            f"{self.crash_points} crash points ({self.relayed_points} at the relay's"
            f" barriers), {self.states} crash states checked, "
            f"{len(self.failures)} failing; record {self.record_s:.1f} s, "
            f"explore {self.explore_s:.1f} s"
        )


@dataclass
class Recording:
    """A recorded workload: the data directory it ran in and its operations."""

    data: Path
    ops: list[trace.Op]
    seconds: float


def record(size: int, seed: int) -> Recording:
    """Record the workload once (its files are deleted; the trace is all that is kept)."""
    work = Path(tempfile.mkdtemp(prefix="eventlane-powerloss-rec-"))
    try:
        t0 = time.monotonic()
        data, ops = record_workload(work, size, seed)
        return Recording(data, ops, time.monotonic() - t0)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def record_workload(work: Path, size: int, seed: int) -> tuple[Path, list[trace.Op]]:
    """Run the workload under strace in ``work``; return the data dir and its operations."""
    data, acks, tr = work / "data", work / "acks.jsonl", work / "trace.txt"
    data.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    trace.record(
        [
            sys.executable,
            "-m",
            "tests.powerloss.workload",
            str(data),
            str(acks),
            str(size),
            str(seed),
        ],
        tr,
        env=env,
        timeout=600,
    )
    return data, trace.parse(tr, data, acks)


def _state_file(copies: list[bytes], rng: random.Random) -> bytes | None:
    """A partition ``state`` a power loss may leave: a copy it held, zeros, or none."""
    choice = rng.random()
    if choice < 0.15 or not copies:
        return bytes(128) if choice < 0.1 else None
    raw = bytearray(copies[-1] if choice < 0.7 else rng.choice(copies))
    struct.pack_into("<Q", raw, 80, BOOT ^ 0x9E3779B97F4A7C15)  # written before the reboot
    return bytes(raw)


def explore(
    size: int = 2,
    seed: int = 1,
    crash_points: int = 40,
    states_per_point: int = 3,
    *,
    keep_failures: Path | None = None,
    deadline_s: float | None = None,
    strict_dirs: bool = True,
    lying_disk: bool = False,
    recording: Recording | None = None,
) -> Figures:
    """Record one workload (or use ``recording``) and check ``crash_points *
    states_per_point`` crash states."""
    fig = Figures()
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="eventlane-powerloss-"))
    try:
        rec = recording if recording is not None else record(size, seed)
        data, ops = rec.data, rec.ops
        fig.record_s = rec.seconds
        fig.ops = len(ops)
        fig.fsyncs = sum(op.kind == "fsync" for op in ops)
        all_acks = [op.text for op in ops if op.kind == "ack"]
        fig.acks = len(all_acks)
        candidates = [i for i, op in enumerate(ops) if op.kind in ("ack", "fsync")]
        # before and after each barrier; always the very end (everything acknowledged)
        points = sorted({i for c in candidates for i in (c, c + 1)} | {len(ops)})
        # a third of the points inside compaction and retention passes, at any call
        maintenance = _maintenance_windows(ops)
        chosen = set(rng.sample(maintenance, min(crash_points // 3, len(maintenance))))
        # a quarter at the barriers of another process (the relay writing this one's saves)
        relayed = [p for p in points if p not in chosen and _relayed(ops, p)]
        chosen.update(rng.sample(relayed, min(crash_points // 4, len(relayed))))
        fig.relayed_points = len(chosen & set(relayed))
        rest = [p for p in points if p not in chosen]
        chosen.update(rng.sample(rest, min(crash_points - 1 - len(chosen), len(rest))))
        chosen.add(len(ops))
        t1 = time.monotonic()
        replay = crashfs.Replay(data, strict_dirs=strict_dirs, lying_disk=lying_disk)
        n = 0
        for index in range(len(ops) + 1):
            if index in chosen:
                if deadline_s is not None and time.monotonic() - t1 > deadline_s:
                    break
                fig.crash_points += 1
                snap = replay.snapshot()
                exp = oracle.expectations(snap.acks, all_acks)
                for state in crashfs.crash_states(snap, rng, states_per_point):
                    n += 1
                    fig.states += 1
                    problems = _check_state(state, snap.root, exp, work / f"s{n}", rng)
                    if problems:
                        kept = None
                        if keep_failures is not None:
                            kept = keep_failures / f"state-{n}"
                            shutil.copytree(work / f"s{n}", kept, dirs_exist_ok=True)
                        fig.failures.append(Failure(state.label, problems, kept))
                    shutil.rmtree(work / f"s{n}", ignore_errors=True)
            if index < len(ops):
                replay.step(ops[index])
        fig.explore_s = time.monotonic() - t1
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return fig


def _relayed(ops: list[trace.Op], point: int) -> bool:
    """Whether the crash point is at a barrier of a process the workload started (the
    relay's fsync, or just after it) or at a save it answered."""
    near = [ops[i] for i in (point - 1, point) if 0 <= i < len(ops)]
    return any(
        (op.kind == "fsync" and op.fd >= trace.PER_PROCESS)
        or (op.kind == "ack" and "acc-relayed" in op.text)
        for op in near
    )


def _maintenance_windows(ops: list[trace.Op]) -> list[int]:
    """Every crash point inside a maintenance pass: after its ``begin`` acknowledgement and
    before the next acknowledgement that is not part of the pass (its ``end`` lines)."""
    out: list[int] = []
    begin: int | None = None
    for i, op in enumerate(ops):
        if op.kind != "ack":
            continue
        if '"phase":"begin"' in op.text:
            begin = i if begin is None else begin
        elif '"phase":"end"' not in op.text and begin is not None:
            out.extend(range(begin + 1, i + 1))
            begin = None
    return out


def _check_state(
    state: crashfs.CrashState,
    root: str,
    exp: oracle.Expectations,
    target: Path,
    rng: random.Random,
) -> list[str]:
    crashfs.materialise(state, root, target)
    for rel, copies in exp.states.items():
        path = target / rel
        if path.exists():
            content = _state_file(copies, rng)
            if content is None:
                path.unlink()
            else:
                path.write_bytes(content)
    for state_path in target.glob("topics/*/*/state"):
        raw = bytearray(state_path.read_bytes())
        if len(raw) >= 88:
            struct.pack_into("<Q", raw, 80, BOOT ^ 0x9E3779B97F4A7C15)
            state_path.write_bytes(bytes(raw))
    try:
        return oracle.check(target, exp)
    except Exception as exc:  # any exception during recovery is a finding
        return [f"recovery raised {type(exc).__name__}: {exc}"]
