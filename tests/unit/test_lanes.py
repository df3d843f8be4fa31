"""api.handlers.Lanes: each request's synchronous calls run on one long-lived thread, the least busy
lane's, so one request stuck in a query does not hold up a request that arrives beside it."""

from __future__ import annotations

import asyncio
import threading

from asgiref.sync import sync_to_async

from api.handlers import Lanes


def test_a_request_shares_one_thread_and_the_next_takes_the_idle_lane():
    lanes = Lanes(2)
    release = threading.Event()

    async def main():
        async with lanes.context():
            stuck = asyncio.ensure_future(sync_to_async(release.wait)())
            first = await sync_to_async(threading.current_thread)()
            async with lanes.context():  # a second request while the first is stuck in a call
                other = await asyncio.wait_for(sync_to_async(threading.current_thread)(), 5)
            release.set()
            await stuck
            again = await sync_to_async(threading.current_thread)()
        async with lanes.context():
            later = await sync_to_async(threading.current_thread)()
        return first, other, again, later

    first, other, again, later = asyncio.run(main())
    assert first is again  # one request, one thread
    assert other is not first  # the busy lane was not taken
    assert later.name.startswith("lane-") and first.name.startswith("lane-")
