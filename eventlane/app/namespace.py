"""An app's namespace: the one place its declared (bare) names become names on the log.

User code declares bare names (``class Order(Aggregate, topic="orders")``, a projector's
``name = "invoices"`` and ``topics = (Order,)``, ``App(keys_topic=...)``). An app declared with
``App("billing", ..., namespace="acme")`` keeps every name it owns on the log and the local
directory under the prefix ``acme.``, the convention of Kafka deployments that share a cluster
(a topic prefix per team or environment, which prefixed ACLs then grant as a whole)::

    declared                       no namespace            namespace="acme"
    aggregate topic  orders        orders                  acme.orders
    snapshots        (derived)     orders.snapshots        acme.orders.snapshots
    projector topic  payments      payments                acme.payments
    consumer group   invoices      invoices                acme.invoices
    dead letters     (derived)     invoices.dlq            acme.invoices.dlq
    personal keys    billing.keys  billing.keys            acme.billing.keys
    read model       invoices      readmodels/invoices.*   readmodels/acme.invoices.*

so two apps, or two deployments of one app (staging and production, two tenants), share one
data directory or one cluster without seeing each other's topics, groups, dead letters,
keys, snapshots, read models, pause files and worker logs. Without a namespace every name is
exactly the declared one (data directories written before namespaces existed open unchanged).

**The separator is ``.``**, the one eventlane already uses for names it derives
(``<topic>.snapshots``, ``<group>.dlq``, ``<app>.keys``), and legal in topic names and group ids
alike (:mod:`eventlane.log.names`: ``[a-zA-Z0-9._-]``). A namespace itself may not contain
``.`` (letters, digits, ``_`` and ``-``; it starts with a letter or digit, so it cannot be
mistaken for an internal ``__`` topic or the topics directory's ``.``-names): the first ``.``
of a namespaced name therefore always ends the namespace, and :meth:`Namespace.owns` /
:meth:`Namespace.bare` invert the mapping without ambiguity.  Like every prefix scheme (and
Kafka's), it relies on operators not giving an app without a namespace topics that start with
another app's ``<namespace>.``.

Records, envelopes, :class:`~eventlane.projection.EventContext` and errors carry the full
(prefixed) topic, which is what ``eventlane consume``, ``topics describe`` and ``groups
describe`` take; commands that take ``APP`` resolve names through the app's namespace.

    >>> ns = Namespace("acme")
    >>> ns.topic("orders"), ns.group("invoices"), ns.owns("acme.orders"), ns.bare("acme.orders")
    ('acme.orders', 'acme.invoices', True, 'orders')
    >>> Namespace(None).topic("orders")
    'orders'
    >>> Namespace("ac.me")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    eventlane.errors.ConfigError: namespace 'ac.me' is illegal: ...
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from attrs import field, frozen

from eventlane.domain import Aggregate
from eventlane.errors import ConfigError
from eventlane.log.names import validate_topic_name
from eventlane.projection.projector import Projector

__all__ = ["MAX_NAMESPACE_LENGTH", "SEPARATOR", "Namespace"]

SEPARATOR = "."
"""Between a namespace and a declared name (see the module docstring for why ``.``)."""
MAX_NAMESPACE_LENGTH = 64
_LEGAL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


def _check(_self: object, _attribute: object, prefix: str | None) -> None:
    if prefix is not None and (
        not isinstance(prefix, str)
        or len(prefix) > MAX_NAMESPACE_LENGTH
        or not _LEGAL.fullmatch(prefix)
    ):
        raise ConfigError(
            f"namespace {prefix!r} is illegal: 1 to {MAX_NAMESPACE_LENGTH} ASCII letters,"
            " digits, '_' and '-', starting with a letter or digit (no '.': it separates the"
            " namespace from the names in it)"
        )


@frozen
class Namespace:
    """The name mapping of one app; ``Namespace(None)`` maps every name to itself.

    Immutable and picklable (Spark executors receive it with the app)."""

    prefix: str | None = field(default=None, validator=_check)
    """The namespace (``None``: none)."""

    # ------------------------------------------------------------------ bare -> full
    def topic(self, name: str) -> str:
        """The topic on the log for the declared topic ``name``."""
        if self.prefix is None:
            return name
        return validate_topic_name(f"{self.prefix}{SEPARATOR}{name}")

    def topics(self, names: Iterable[str]) -> tuple[str, ...]:
        return tuple(self.topic(n) for n in names)

    def aggregate_topic(self, cls: type[Aggregate]) -> str:
        """The event topic of aggregate class ``cls`` (its declared ``topic``, namespaced)."""
        return self.topic(cls.topic)

    def projector_topics(self, cls: type[Projector]) -> tuple[str, ...]:
        """The topics projector class ``cls`` consumes (its ``topic_names``, namespaced)."""
        return self.topics(cls.topic_names)

    def group(self, projector: str) -> str:
        """The consumer group id of projector ``projector`` (its dead letters go to
        ``<group>.dlq``)."""
        return self.topic(projector)

    def local(self, projector: str) -> str:
        """The name of projector ``projector``'s files in the local directory (read model,
        shadow, rebuild output, pause files, worker log: see
        :class:`~eventlane.log.local.LocalDir`). The same as its group id."""
        return self.group(projector)

    # ------------------------------------------------------------------ full -> bare
    def owns(self, name: str) -> bool:
        """Whether the topic or group ``name`` is in this namespace (everything is, for
        ``Namespace(None)``)."""
        return self.prefix is None or name.startswith(self.prefix + SEPARATOR)

    def bare(self, name: str) -> str:
        """The declared name of the topic or group ``name``; ``ConfigError`` when it is not
        in this namespace."""
        if self.prefix is None:
            return name
        if not self.owns(name):
            raise ConfigError(f"{name!r} is not in namespace {self.prefix!r}", topic=name)
        return name[len(self.prefix) + len(SEPARATOR) :]
