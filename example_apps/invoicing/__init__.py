"""The invoicing sample app: orders in, exactly one invoice per order out.

``example_apps.invoicing:app`` is the application object the CLI takes as ``APP``.
"""

from example_apps.invoicing.app import app

__all__ = ["app"]
