"""Migration sets of every SQLite database eventlane and its example apps create.

Each module holds ``sqlite_utils.Migrations`` sets; ``eventlane migrate APP`` applies the
pending ones, and a projector refuses to start while any of its read model's are pending.

* :mod:`migrations.eventlane` — the framework's own tables inside every read model
  (positions, dead letters).
"""
