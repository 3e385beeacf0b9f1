"""``LocalDir``: the state that always lives on the local host, named in one place.

Whatever engine holds the log (the embedded files, a JetStream cluster), read models, pause
files, rebuild shadows and worker logs are local files. The embedded engine also keeps its
group state and key indexes here. Layers above the log reach these files only through this
object (``log.local``), never by joining paths onto a log.

Layout under ``root`` (the data directory)::

    readmodels/<name>.sqlite            a projector's read model
    readmodels/<name>.shadow.sqlite     a rebuild being handed over (replay.handoff)
    readmodels/<name>.rebuild.sqlite    a rebuild's default output
    readmodels/<name>.pause             pause request, and <name>.pause-acks/ (projection.pause)
    readmodels/<name>.log               worker logs of ``eventlane project --show``
    groups/<group>/                     embedded group coordination (consumer.coordinator)
    store/<topic>/<p>.keyindex.sqlite   embedded key indexes (log.key_index)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

__all__ = ["DEFAULT_DATA_DIR", "LocalDir", "default_data_dir"]

DEFAULT_DATA_DIR = "eventlane-data"


def default_data_dir() -> Path:
    """``$EVENTLANE_DATA``, else ``./eventlane-data``: the data directory (and local
    directory) when none is named."""
    return Path(os.environ.get("EVENTLANE_DATA") or DEFAULT_DATA_DIR)


class LocalDir(NamedTuple):
    """The local data directory; every method returns a path and creates nothing."""

    root: Path

    @classmethod
    def at(cls, root: str | Path) -> LocalDir:
        return cls(Path(root))

    def readmodels(self) -> Path:
        return self.root / "readmodels"

    def readmodel(self, name: str) -> Path:
        return self.readmodels() / f"{name}.sqlite"

    def shadow(self, name: str) -> Path:
        return self.readmodels() / f"{name}.shadow.sqlite"

    def rebuild_output(self, name: str) -> Path:
        return self.readmodels() / f"{name}.rebuild.sqlite"

    def pause(self, name: str) -> Path:
        return self.readmodels() / f"{name}.pause"

    def pause_acks(self, name: str) -> Path:
        return self.readmodels() / f"{name}.pause-acks"

    def worker_log(self, name: str) -> Path:
        return self.readmodels() / f"{name}.log"

    def groups(self) -> Path:
        return self.root / "groups"

    def group(self, group: str) -> Path:
        return self.groups() / group

    def key_indexes(self) -> Path:
        return self.root / "store"
