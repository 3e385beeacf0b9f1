"""Replay: rebuild projections from the low-water mark, locally or with Spark."""
