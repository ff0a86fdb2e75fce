"""Ray's ActorUnavailableError is retried for a grace period, not taken for an actor's death."""

from __future__ import annotations

import time

import pytest

ray = pytest.importorskip("ray")


def test_an_unavailable_actor_is_retried_within_the_grace_and_dead_after_it() -> None:
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from workers.executors.ray_watch import still_unavailable

    since: dict[int, float] = {}
    flaky = ActorUnavailableError("the connection to the actor broke", None)
    assert still_unavailable(flaky, 1, since, grace_s=0.2)
    assert still_unavailable(flaky, 1, since, grace_s=0.2) and list(since) == [1]
    assert still_unavailable(flaky, 0, since, grace_s=0.2)  # each rank has its own clock
    time.sleep(0.25)
    assert not still_unavailable(flaky, 1, since, grace_s=0.2)  # past the grace: dead
    assert not still_unavailable(ActorDiedError(), 2, since, grace_s=60)  # death is never retried
    assert not still_unavailable(RuntimeError("rank raised"), 3, since, grace_s=60)
    assert set(since) == {0, 1}
