"""The dashboard's WebSocket: staff get the engine's live state every second and each new usage record."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from dashboard import consumers
from dashboard.consumers import engine_stats  # the real one (the autouse fixture replaces the module's)
from dashboard.routing import websocket_urlpatterns
from tests.usage_helpers import add_usage

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/ws/admin/engine/"


@pytest.fixture(autouse=True)
def fake_engine(monkeypatch):
    """An engine whose figures the test sets; the real one needs a loaded model."""
    figures = {"ready": True, "running": 2, "waiting": 1, "tokens_per_second": 42.5}
    monkeypatch.setattr(consumers, "engine_stats", lambda: dict(figures))
    monkeypatch.setattr(consumers, "INTERVAL_SECONDS", 0.05)
    return figures


def communicator_for(user) -> WebsocketCommunicator:
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), PATH)
    communicator.scope["user"] = user
    return communicator


@pytest.mark.parametrize("who", ["anonymous", "user"])
def test_only_staff_may_connect(who, user):
    async def attempt():
        communicator = communicator_for(AnonymousUser() if who == "anonymous" else user)
        connected, _ = await communicator.connect()
        await communicator.disconnect()
        return connected

    assert async_to_sync(attempt)() is False


def test_staff_receive_the_engines_figures_and_their_changes(staff_user, fake_engine):
    async def watch():
        communicator = communicator_for(staff_user)
        connected, _ = await communicator.connect()
        first = await communicator.receive_json_from(timeout=2)
        fake_engine["running"] = 3
        while (later := await communicator.receive_json_from(timeout=2))["running"] != 3:
            pass
        await communicator.disconnect()
        return connected, first, later

    connected, first, later = async_to_sync(watch)()

    assert connected
    assert first == {"type": "engine", "ready": True, "running": 2, "waiting": 1, "tokens_per_second": 42.5}
    assert later["running"] == 3


def test_staff_are_told_of_each_new_usage_record(staff_user, valid_key):
    async def watch():
        communicator = communicator_for(staff_user)
        await communicator.connect()
        await sync_to_async(add_usage)(valid_key.api_key, timezone.now(), prompt_tokens=11, completion_tokens=4)
        while (event := await communicator.receive_json_from(timeout=2))["type"] != "usage":
            pass
        await communicator.disconnect()
        return event

    event = async_to_sync(watch)()

    assert (event["status_code"], event["input_tokens"], event["output_tokens"]) == (200, 11, 4)
    assert event["model"] == "smollm2-135m-instruct"


def test_a_failing_channel_layer_never_breaks_accounting(valid_key, monkeypatch):
    class Broken:
        async def group_send(self, group, message):
            raise ConnectionError("redis is down")

    monkeypatch.setattr("dashboard.live.get_channel_layer", lambda: Broken())

    record = add_usage(valid_key.api_key, timezone.now())

    assert record.pk is not None


@pytest.mark.parametrize(
    ("redis_url", "backend"),
    [
        ("", "channels.layers.InMemoryChannelLayer"),
        ("redis://127.0.0.1:6399/0", "channels_redis.core.RedisChannelLayer"),
    ],
)
def test_the_channel_layer_is_in_memory_unless_redis_url_is_set(redis_url, backend):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    code = "from django.conf import settings; print(settings.CHANNEL_LAYERS['default']['BACKEND'])"
    env = {**os.environ, "REDIS_URL": redis_url, "DJANGO_SETTINGS_MODULE": "completions_site.settings"}
    result = subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {code}"],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    assert result.stdout.strip() == backend


def test_the_engine_figures_are_each_models_and_their_sums(monkeypatch):
    from inference import process
    from inference.registry import ModelRegistry, ServedModel

    class Engine:
        def __init__(self, model_id: str, ready: bool, running: int, waiting: int, rate: float) -> None:
            self.model_id, self.ready = model_id, ready
            self.figures = {"running": running, "waiting": waiting, "tokens_per_second": rate}

        def stats(self) -> dict:
            return dict(self.figures)

    small, big = Engine("small", True, 2, 0, 40.25), Engine("big", False, 1, 3, 2.5)
    monkeypatch.setattr(process, "_models", ModelRegistry([ServedModel(small), ServedModel(big)]))

    figures = engine_stats()

    assert figures == {
        "ready": False,  # until every model is
        "running": 3,
        "waiting": 3,
        "tokens_per_second": 42.8,
        "models": [
            {"model": "small", "ready": True, "running": 2, "waiting": 0, "tokens_per_second": 40.25},
            {"model": "big", "ready": False, "running": 1, "waiting": 3, "tokens_per_second": 2.5},
        ],
    }


def test_before_the_models_are_made_the_figures_say_loading(monkeypatch):
    from inference import process

    monkeypatch.setattr(process, "_models", None)

    assert engine_stats() == {"ready": False}
