"""Concurrency slots are leased and renewed while their request runs: a process killed without
settling frees its slots within one lease (``API_LIMITS_CONCURRENCY_LEASE_SECONDS``), on both stores.

The lease is shortened to 0.6 s (renewed every 0.2 s) so that the tests wait a second, not a minute.
"""

from __future__ import annotations

import asyncio

import pytest
from asgiref.sync import async_to_sync

from keys import limits
from tests.conftest import issue

pytestmark = pytest.mark.django_db(transaction=True)

LEASE = 0.6


@pytest.fixture
def one_at_a_time(user, settings, limits_store):
    settings.API_LIMITS_CONCURRENCY_LEASE_SECONDS = LEASE
    return issue(user, "one at a time", max_concurrent=1, rpm_limit=0, tpm_limit=0).api_key


async def admitted(api_key, request_id: str) -> bool:
    try:
        admission = await limits.admit(api_key, request_id, 1)
    except Exception:  # noqa: BLE001 - refused
        return False
    await admission.settle(0)
    return True


def test_a_running_request_keeps_its_slot_for_longer_than_the_lease(one_at_a_time):
    async def scenario():
        running = await limits.admit(one_at_a_time, "cmpl-long", 1)
        await asyncio.sleep(LEASE * 2.5)  # a long stream: renewed meanwhile
        during = await admitted(one_at_a_time, "cmpl-other")
        await running.settle(1)
        return during, await admitted(one_at_a_time, "cmpl-after")

    assert async_to_sync(scenario)() == (False, True)


def test_the_slot_of_a_process_killed_without_settling_frees_itself_within_one_lease(one_at_a_time):
    async def scenario():
        killed = await limits.admit(one_at_a_time, "cmpl-killed", 1)
        assert killed.renewal is not None
        killed.renewal.cancel()  # the process is gone: nothing renews, nothing settles
        at_once = await admitted(one_at_a_time, "cmpl-at-once")
        await asyncio.sleep(LEASE * 1.5)
        return at_once, await admitted(one_at_a_time, "cmpl-later")

    assert async_to_sync(scenario)() == (False, True)


def test_a_slot_lost_while_its_request_runs_is_taken_again_at_the_next_renewal(one_at_a_time, limits_store):
    """Redis restarted without its data: the running request counts again within a renewal."""
    if limits_store != "redis":
        pytest.skip("the in-process counters cannot lose a slot")
    import redis

    from tests.conftest import TEST_REDIS_URL

    async def scenario():
        running = await limits.admit(one_at_a_time, "cmpl-running", 1)
        key_scope = (await limits.scopes_of(one_at_a_time))[0]
        in_flight = limits.limiter().redis.key_names(key_scope)["in_flight"]
        redis.Redis.from_url(TEST_REDIS_URL).delete(in_flight)
        lost = await admitted(one_at_a_time, "cmpl-while-lost")
        await asyncio.sleep(LEASE / 3 * 1.5)
        retaken = await admitted(one_at_a_time, "cmpl-after-renewal")
        await running.settle(1)
        return lost, retaken

    assert async_to_sync(scenario)() == (True, False)


def test_a_key_without_a_concurrency_limit_renews_nothing(user, limits_store):
    unlimited = issue(user, "unlimited", max_concurrent=0).api_key

    async def scenario():
        admission = await limits.admit(unlimited, "cmpl-free", 1)
        renewal = admission.renewal
        await admission.settle(1)
        return renewal

    assert async_to_sync(scenario)() is None
