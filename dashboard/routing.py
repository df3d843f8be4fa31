"""WebSocket routes (mounted by ``completions_site/asgi.py`` behind session auth)."""

from __future__ import annotations

from django.urls import path

from .consumers import EngineStatsConsumer

websocket_urlpatterns = [
    path("ws/admin/engine/", EngineStatsConsumer.as_asgi(), name="ws-engine"),
]
