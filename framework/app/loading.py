"""Finding the application a command names: ``module:attribute`` (the CLI's ``APP``)."""

from __future__ import annotations

import importlib
import os
from typing import Any

from framework.app.application import App
from framework.errors import ConfigError

__all__ = ["load_app"]


def load_app(spec: str | None = None) -> App:
    """Import the :class:`App` named ``module:attribute``, or ``module`` (its attribute
    ``app``); default ``$EVENTLANE_APP``."""
    spec = spec or os.environ.get("EVENTLANE_APP")
    if not spec:
        raise ConfigError("APP must be 'module:attribute' or 'module' (or set EVENTLANE_APP)")
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    if not module_name:
        raise ConfigError(f"APP must be 'module:attribute' or 'module', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r} for APP {spec!r}: {exc}") from None
    app: Any = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not an eventlane App (got {type(app).__name__})")
    return app
