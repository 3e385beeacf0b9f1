"""KRaft cluster ids as Kafka's storage tool takes them: one starting with ``-`` (1 id in
64) was read by the tool as an option ("argument --cluster-id/-t: expected one argument")
and ``eventlane kafka up`` failed."""

from __future__ import annotations

import base64

from eventlane.log.kafka.cluster import new_cluster_id


def test_cluster_ids_never_start_with_a_dash_and_are_uuids() -> None:
    ids = [new_cluster_id() for _ in range(3000)]  # P(no dash among 3000 before) ~ 1e-21
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
