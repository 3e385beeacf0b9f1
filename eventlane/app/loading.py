"""Finding the application a command names: ``module:attribute`` (the CLI's ``APP``)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Any

from eventlane.app.application import App
from eventlane.errors import ConfigError
from eventlane.observability import route_structlog

__all__ = ["load_app"]


def load_app(spec: str | None = None) -> App:
    """Import the :class:`App` named ``module:attribute``, or ``module`` (its attribute
    ``app``); default ``$EVENTLANE_APP``.

    The module is looked up in the current directory first, then on ``sys.path``, as
    ``uvicorn``, ``flask`` and ``celery`` do. A file path (``library/app.py[:app]``) under
    the current directory is accepted as its dotted module name (``library.app:app``).
    """
    route_structlog()  # in the CLI, the app's own structlog loggers write where eventlane's do
    spec = spec or os.environ.get("EVENTLANE_APP")
    if not spec:
        raise ConfigError("APP must be 'module:attribute' or 'module' (or set EVENTLANE_APP)")
    module_name, _, attr = spec.partition(":")
    attr = attr or "app"
    module_name = _module_of_path(module_name, attr, spec)
    if not module_name:
        raise ConfigError(f"APP must be 'module:attribute' or 'module', got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # what `python -m` gives a script: the current directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(
            f"cannot import {module_name!r} for APP {spec!r}: {exc} (APP is module:attribute,"
            f" e.g. library.app:app, importable from the current directory {cwd} or PYTHONPATH)"
        ) from None
    app: Any = getattr(module, attr, None)
    if not isinstance(app, App):
        raise ConfigError(f"{spec!r} is not an eventlane App (got {type(app).__name__})")
    return app


def _module_of_path(name: str, attr: str, spec: str) -> str:
    """``library/app.py`` -> ``library.app`` (a path under the current directory)."""
    if "/" not in name and os.sep not in name and not name.endswith(".py"):
        return name
    path = Path(name)
    if path.is_absolute() and path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    dotted = ".".join(path.with_suffix("").parts) if path.suffix == ".py" else ""
    if path.is_absolute() or ".." in path.parts or not dotted.replace(".", "").isidentifier():
        package = path.resolve().parent
        raise ConfigError(
            f"APP {spec!r} is a path outside the current directory; give it as"
            f" module:attribute, e.g. {package.name}.{path.stem}:{attr}, and run from"
            f" {package.parent} (the directory that holds the package)"
        )
    return dotted
