"""Shared fixtures, and the level of each test from its folder.

Personas: named users and keys that tests ask for by role instead of building their own.

Levels (``pytest -m unit``, ``-m "not e2e"``, ...): ``tests/unit`` (no database, no server: pure
functions and the engine on the tiny model), ``tests/integration`` (Django's test database, the
views in this process on the tiny model), ``tests/e2e`` (a live daphne server with the real model),
``tests/browser`` (that server driven in headless Chromium; also marked ``e2e``).
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from keys.models import APIKey

# Redis for the tests that run the limits on it: REDIS_URL when the suite runs with one (CI's
# second run), else the local default; they are skipped when it does not answer.
TEST_REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"

# The markers each test folder gives its tests (pytest.ini declares them).
LEVEL_MARKERS = {
    "unit": ("unit",),
    "integration": ("integration",),
    "e2e": ("e2e",),
    "browser": ("e2e", "browser"),
}
TESTS_ROOT = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its folder's level; a test outside the four folders gets none."""
    for item in items:
        path = Path(item.path).resolve()
        if not path.is_relative_to(TESTS_ROOT):
            continue
        parts = path.relative_to(TESTS_ROOT).parts
        for name in LEVEL_MARKERS.get(parts[0], ()) if len(parts) > 1 else ():
            item.add_marker(name)


# --- Personas -----------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    """Personas have passwords; PBKDF2 would spend most of a short test hashing them."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@dataclass(frozen=True)
class IssuedKey:
    """A key as its owner holds it: the database row and the plaintext shown once at creation."""

    api_key: APIKey
    plaintext: str


def issue(owner, name: str, **options) -> IssuedKey:
    """Create a key for ``owner`` through the real ``create_key``."""
    return IssuedKey(*APIKey.objects.create_key(name=name, owner=owner, **options))


@pytest.fixture
def user(db, django_user_model):
    """Alice, an ordinary API user without admin access."""
    return django_user_model.objects.create_user(username="alice", password="alice-password-1")


@pytest.fixture
def other_user(db, django_user_model):
    """Bob, another API user, for tests about one user's keys versus another's."""
    return django_user_model.objects.create_user(username="bob", password="bob-password-1")


@pytest.fixture
def staff_user(db, django_user_model):
    """Sam, who runs the admin site: staff and superuser."""
    return django_user_model.objects.create_superuser(
        username="sam", email="sam@example.org", password="sam-password-1"
    )


@pytest.fixture
def valid_key(user) -> IssuedKey:
    """Alice's working key."""
    return issue(user, "alice laptop")


@pytest.fixture
def revoked_key(user) -> IssuedKey:
    """Alice's key that she revoked."""
    issued = issue(user, "alice revoked")
    issued.api_key.revoke()
    return issued


@pytest.fixture
def expired_key(user) -> IssuedKey:
    """Alice's key whose expiry passed a minute ago."""
    return issue(user, "alice expired", expires_at=timezone.now() - timedelta(minutes=1))


@pytest.fixture
def other_users_key(other_user) -> IssuedKey:
    """Bob's working key."""
    return issue(other_user, "bob server")


@pytest.fixture
def limited_key(user) -> IssuedKey:
    """Alice's key for 3 requests and 100 tokens a minute, 2 requests at a time."""
    return issue(user, "alice limited", rpm_limit=3, tpm_limit=100, max_concurrent=2)


@pytest.fixture
def quota_key(user) -> IssuedKey:
    """Alice's key with a quota of 30 tokens a month and no per-minute limits."""
    return issue(user, "alice quota", monthly_token_quota=30, rpm_limit=0, tpm_limit=0)


@pytest.fixture
def restricted_key(user) -> IssuedKey:
    """Alice's key for the models ``other-model`` and ``third-model`` only."""
    return issue(user, "alice restricted", allowed_models="other-model,third-model")


# --- Admin keys (the Administration API) -----------------------------------------------------------


@dataclass(frozen=True)
class IssuedAdminKey:
    """An admin key as its owner holds it: the row and the plaintext shown once."""

    admin_key: Any
    plaintext: str


def issue_admin_key(owner, name: str, **options) -> IssuedAdminKey:
    """Create an admin key for ``owner`` through the real ``create_key``."""
    from organization.models import AdminAPIKey

    return IssuedAdminKey(*AdminAPIKey.objects.create_key(name=name, owner=owner, **options))


@pytest.fixture
def admin_key(staff_user) -> IssuedAdminKey:
    """Sam's admin key, for the Administration API."""
    return issue_admin_key(staff_user, "sam provisioning")


@pytest.fixture
def read_only_admin_key(staff_user) -> IssuedAdminKey:
    """Sam's read-only admin key: it may read the Administration API, not change it."""
    return issue_admin_key(staff_user, "sam dashboards", scope="read_only")


@pytest.fixture
def revoked_admin_key(staff_user) -> IssuedAdminKey:
    """Sam's admin key that was deleted (revoked)."""
    issued = issue_admin_key(staff_user, "sam revoked")
    issued.admin_key.revoke()
    return issued


@pytest.fixture
def expired_admin_key(staff_user) -> IssuedAdminKey:
    """Sam's admin key whose expiry passed a minute ago."""
    return issue_admin_key(staff_user, "sam expired", expires_at=timezone.now() - timedelta(minutes=1))


# --- Limits -------------------------------------------------------------------------------------


def redis_reachable(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5).ping())
    except (redis.RedisError, OSError):
        return False


@pytest.fixture(autouse=True)
def separate_limit_counters(settings):
    """Each test counts from zero: a Redis key prefix of its own, and so a fresh in-process store;
    and each reads the model prices afresh (the database is emptied between tests, silently)."""
    from keys.pricing import prices

    prices.forget()
    prefix = f"completions-site-test:{uuid.uuid4().hex[:12]}:"
    settings.API_LIMITS_REDIS_PREFIX = prefix
    yield prefix
    forget_limit_counters(settings.REDIS_URL, prefix)


@pytest.fixture(params=["in-process", "redis"])
def limits_store(request, settings) -> str:
    """Runs a test twice: counters in this process, then in Redis (skipped if Redis is not there)."""
    if request.param == "redis":
        if not redis_reachable(TEST_REDIS_URL):
            pytest.skip(f"Redis is not reachable at {TEST_REDIS_URL}")
        settings.REDIS_URL = TEST_REDIS_URL
    else:
        settings.REDIS_URL = ""
    return request.param


@pytest.fixture(autouse=True)
def separate_usage_journal(settings, tmp_path):
    """Each test journals usage in a folder of its own (a fresh journal; no flusher thread: tests
    call ``get_journal().flush()`` where they need what waits written), and starts with a database
    that answers."""
    from keys.db import database_health
    from keys.journal import forget_journal

    database_health.reachable = True
    settings.USAGE_JOURNAL_DIR = tmp_path / "journal"
    yield settings.USAGE_JOURNAL_DIR
    forget_journal()
    database_health.reachable = True


# --- The API in this process, on the tiny model (fast view-level tests) ---------------------------


@pytest.fixture(scope="session")
def tiny_engine():
    from testing.tiny_engine import start_tiny_engine

    engine = start_tiny_engine()
    yield engine
    engine.stop()


def serve(monkeypatch, *served) -> None:
    """Make the views serve ``served`` (engines, or ``(engine, aliases)`` pairs), in order, instead of
    the process's own models.  A lone engine answers to ``MODEL_ALIASES`` as the settings say at each
    request, as a single-model process does."""
    from django.conf import settings

    from inference.registry import ModelRegistry, ServedModel

    def models() -> ModelRegistry:
        if len(served) == 1 and not isinstance(served[0], tuple):
            return ModelRegistry([ServedModel(served[0], tuple(settings.MODEL_ALIASES))])
        return ModelRegistry(
            ServedModel(*entry) if isinstance(entry, tuple) else ServedModel(entry) for entry in served
        )

    monkeypatch.setattr("api.views.get_models", models)


@pytest.fixture(scope="session")
def qwen3_engine(tmp_path_factory):
    """A second model beside the tiny one: a tiny Qwen3 GGUF (another shape, a byte tokenizer, a chat
    template) served in float32 (the deterministic mode: batched rows as alone), as ``tiny-qwen3``."""
    pytest.importorskip("gguf")
    from inference.engine import Engine, EngineConfig
    from inference.model_loader import ModelConfig
    from testing import tiny_families

    path = tiny_families.write_tiny_gguf(tmp_path_factory.mktemp("qwen3") / "tiny-qwen3.gguf")
    engine = Engine(
        ModelConfig(path=str(path), model_id="tiny-qwen3", weights="float32"), EngineConfig(max_batch_size=8)
    )
    engine.start()
    assert engine.wait_ready(300)
    yield engine
    engine.stop()


@pytest.fixture
def two_models(tiny_engine, qwen3_engine, monkeypatch):
    """The real views serving two models, each by its own engine: ``tiny``, then ``tiny-qwen3``
    (alias ``qwen-latest``)."""
    serve(monkeypatch, (tiny_engine, ()), (qwen3_engine, ("qwen-latest",)))
    return tiny_engine, qwen3_engine


@pytest.fixture
def tiny_api(tiny_engine, monkeypatch):
    """The real views, serving the tiny random model (``tests.inprocess_api`` sends the requests)."""
    serve(monkeypatch, tiny_engine)
    return tiny_engine


# --- The live server (end-to-end tests) ---------------------------------------------------------

from testing.live_server import forget_limit_counters, openai_client, server  # noqa: E402,F401  (session fixtures)
