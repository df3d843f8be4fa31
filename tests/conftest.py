"""Shared fixtures.

Personas: named users and keys that tests ask for by role instead of building their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.utils import timezone

from keys.models import APIKey

# --- Personas -----------------------------------------------------------------------------------


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


# --- The live server (end-to-end tests) ---------------------------------------------------------

from tests.live_server import openai_client, server  # noqa: E402,F401  (session fixtures)
