"""Live figures for the staff dashboard: the group its WebSockets join, and usage-record events.

Every new usage record is announced to the ``dashboard`` group of the channel layer once its
transaction commits.  With the Redis layer (``REDIS_URL``) the announcement reaches dashboards
connected to any server process; with the default in-memory layer, those of this process.
Announcing must never break accounting, so a failing layer is logged and ignored.
"""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction
from django.db.models.signals import post_save
from django.dispatch import receiver

from keys.models import UsageRecord

logger = logging.getLogger(__name__)

GROUP = "dashboard"


def usage_event(record: UsageRecord) -> dict[str, Any]:
    """The group message for one record (handled by ``EngineStatsConsumer.usage_recorded``)."""
    return {
        "type": "usage.recorded",
        "model": record.model,
        "status_code": record.status_code,
        "input_tokens": record.prompt_tokens,
        "output_tokens": record.completion_tokens,
        "created_at": record.created_at.isoformat(),
    }


def announce(event: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None or _nobody_listens(layer):
        return
    try:
        async_to_sync(layer.group_send)(GROUP, event)
    except Exception:
        logger.warning("Could not announce a usage record to the dashboard", exc_info=True)


def _nobody_listens(layer: Any) -> bool:
    """Whether the in-process layer has no dashboard in the group.  Announcing anyway would cost
    every usage write a hop from its database thread to the event loop and back, for nobody; a
    shared layer (Redis) cannot tell, so it is always told."""
    return isinstance(layer, InMemoryChannelLayer) and not layer.groups.get(GROUP)


@receiver(post_save, sender=UsageRecord, dispatch_uid="dashboard.announce_usage")
def announce_usage(sender: type[UsageRecord], instance: UsageRecord, created: bool, **kwargs: Any) -> None:
    if created:
        event = usage_event(instance)
        transaction.on_commit(lambda: announce(event), robust=True)
