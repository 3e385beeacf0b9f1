"""The embedded engine: a partitioned log in one data directory, Kafka's storage layer in
miniature. Its one public name is :class:`~eventlane.log.embedded.store.LogStore` (reached
as ``eventlane.log.LogStore``, opened by :mod:`eventlane.engine`); every other module here
is private to the engine (import-linter: only :mod:`eventlane.engine` and the log
package's lazy ``LogStore`` import it, and ``eventlane dump`` reads a segment through
:mod:`.dump`).

Modules, bottom up (each states its invariants on top):

* :mod:`.batch`: the record batch format and its CRC;
* :mod:`.segment`: a segment's log, offset index and time index files;
* :mod:`.check`: checking a segment's batches (``verify``);
* :mod:`.state`: the partition state shared by processes (marks, layout, wake-ups);
* :mod:`.recovery`: opening a partition left by an unclean stop (Kafka's LogLoader);
* :mod:`.partition`: one partition, append and group commit; :mod:`.read`: its read path;
* :mod:`.fds`: the bound on open file descriptors;
* :mod:`.retention` and :mod:`.cleaner`: deleting old segments, compaction;
* :mod:`.keys`, :mod:`.key_index`, :mod:`.key_check`: per-key state (the keyed role);
* :mod:`.store`: topics of partitions in the data directory, the port's roles;
* :mod:`.aio`: the asyncio face (file work in threads, a partition's appends in groups);
* :mod:`.dump`: reading one segment file (``eventlane dump``).
"""
