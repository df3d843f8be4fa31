"""Bearer authentication: who gets in, and the exact 401 everyone else gets.

``authenticate`` is async; the tests drive it with ``async_to_sync`` (pytest-asyncio is not
installed) in transactional tests, so the ORM's worker thread sees the personas' rows.
"""

from __future__ import annotations

import json
import secrets
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncRequestFactory
from django.utils import timezone

from api.auth import authenticate
from api.errors import APIError, error_response
from keys.auth import touch_last_used
from keys.models import APIKey

pytestmark = pytest.mark.django_db(transaction=True)

MISSING = {
    "message": (
        "You didn't provide an API key. You need to provide your API key in an Authorization header "
        "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
    ),
    "type": "invalid_request_error",
    "param": None,
    "code": None,
}
INCORRECT = {
    "message": "Incorrect API key provided.",
    "type": "invalid_request_error",
    "param": None,
    "code": "invalid_api_key",
}


def request_with(authorization: str | None):
    """A POST to /v1/completions carrying ``authorization`` (no header when ``None``)."""
    headers = {} if authorization is None else {"Authorization": authorization}
    return AsyncRequestFactory().post("/v1/completions", data={}, content_type="application/json", headers=headers)


def authenticate_header(authorization: str | None) -> APIKey:
    return async_to_sync(authenticate)(request_with(authorization))


def presented_tokens(valid_key, revoked_key, expired_key) -> dict[str, str]:
    """Every token the matrix presents, by name; built from the personas at test time."""
    prefix = valid_key.api_key.prefix
    return {
        "valid": valid_key.plaintext,
        "revoked": revoked_key.plaintext,
        "expired": expired_key.plaintext,
        "unknown prefix": f"sk-cs-Zz0Zz0Zz.{secrets.token_urlsafe(32)}",
        "wrong secret": f"sk-cs-{prefix}.{secrets.token_urlsafe(32)}",
        "prefix without secret": f"sk-cs-{prefix}",
        "garbage": "definitely-not-a-key",
        "other vendor's key": f"sk-proj-{secrets.token_urlsafe(32)}",
    }


@pytest.mark.parametrize(
    "header, expected",
    [
        pytest.param(None, MISSING, id="no header"),
        pytest.param("Basic {valid}", MISSING, id="wrong scheme"),
        pytest.param("Bearer", MISSING, id="scheme without token"),
        pytest.param("Bearer    ", MISSING, id="empty token"),
        pytest.param("", MISSING, id="empty header"),
        pytest.param("Bearer {revoked}", INCORRECT, id="revoked key"),
        pytest.param("Bearer {expired}", INCORRECT, id="expired key"),
        pytest.param("Bearer {unknown prefix}", INCORRECT, id="unknown prefix"),
        pytest.param("Bearer {wrong secret}", INCORRECT, id="right prefix wrong secret"),
        pytest.param("Bearer {prefix without secret}", INCORRECT, id="prefix without secret"),
        pytest.param("Bearer {garbage}", INCORRECT, id="garbage"),
        pytest.param("Bearer {other vendor's key}", INCORRECT, id="another vendor's key"),
    ],
)
def test_rejected_requests_get_openais_401(header, expected, valid_key, revoked_key, expired_key):
    tokens = presented_tokens(valid_key, revoked_key, expired_key)
    authorization = None if header is None else header.format_map(tokens)

    with pytest.raises(APIError) as raised:
        authenticate_header(authorization)

    response = error_response(raised.value)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"
    assert json.loads(response.content) == {"error": expected}
    for token in tokens.values():
        if token in (authorization or ""):
            # Neither the key, nor its public prefix, nor its secret alone is echoed.
            assert token not in response.content.decode()
            for part in token.removeprefix("sk-cs-").split("."):
                assert part not in response.content.decode()


@pytest.mark.parametrize(
    "template",
    [
        pytest.param("Bearer {key}", id="canonical"),
        pytest.param("bearer {key}", id="lower-case scheme"),
        pytest.param("BEARER {key}", id="upper-case scheme"),
        pytest.param("   Bearer    {key}   ", id="extra surrounding spaces"),
        pytest.param("Bearer\t{key}", id="tab separator"),
    ],
)
def test_a_valid_key_authenticates_in_any_bearer_spelling(template, valid_key):
    api_key = authenticate_header(template.format(key=valid_key.plaintext))

    assert api_key.pk == valid_key.api_key.pk


def test_each_key_authenticates_as_its_own_owner(valid_key, other_users_key):
    assert authenticate_header(f"Bearer {valid_key.plaintext}").owner.username == "alice"
    assert authenticate_header(f"Bearer {other_users_key.plaintext}").owner.username == "bob"


def test_successful_auth_costs_exactly_one_query_including_the_owner(valid_key, django_assert_num_queries):
    with django_assert_num_queries(1):
        api_key = authenticate_header(f"Bearer {valid_key.plaintext}")
        assert api_key.owner.username == "alice"  # loaded by the same query


def test_a_token_not_shaped_like_a_key_is_rejected_without_a_query(valid_key, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(APIError):
        authenticate_header("Bearer definitely-not-a-key")


def test_a_deactivated_owners_key_gets_the_same_incorrect_key_response(valid_key, user):
    user.is_active = False
    user.save()

    with pytest.raises(APIError) as raised:
        authenticate_header(f"Bearer {valid_key.plaintext}")

    assert raised.value.to_dict() == {"error": INCORRECT}


def test_a_key_expiring_in_the_future_still_authenticates(user):
    api_key, plaintext = APIKey.objects.create_key(
        name="soon", owner=user, expires_at=timezone.now() + timedelta(hours=1)
    )

    assert authenticate_header(f"Bearer {plaintext}").pk == api_key.pk


def test_touch_last_used_stamps_a_never_used_key(valid_key):
    assert async_to_sync(touch_last_used)(valid_key.api_key) is True

    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.last_used_at is not None
    assert timezone.now() - valid_key.api_key.last_used_at < timedelta(seconds=5)


def test_touch_last_used_writes_at_most_once_a_minute(valid_key, django_assert_num_queries):
    recently = timezone.now() - timedelta(seconds=30)
    APIKey.objects.filter(pk=valid_key.api_key.pk).update(last_used_at=recently)
    valid_key.api_key.refresh_from_db()

    with django_assert_num_queries(0):
        assert async_to_sync(touch_last_used)(valid_key.api_key) is False

    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.last_used_at == recently


def test_touch_last_used_does_not_overwrite_a_fresher_stamp_from_another_request(valid_key):
    # This copy was loaded before another request stamped the row.
    stale_copy = APIKey.objects.get(pk=valid_key.api_key.pk)
    fresh = timezone.now() - timedelta(seconds=10)
    APIKey.objects.filter(pk=valid_key.api_key.pk).update(last_used_at=fresh)

    assert async_to_sync(touch_last_used)(stale_copy) is False
    assert APIKey.objects.get(pk=valid_key.api_key.pk).last_used_at == fresh


def test_touch_last_used_refreshes_a_stamp_older_than_a_minute(valid_key, django_assert_num_queries):
    long_ago = timezone.now() - timedelta(minutes=5)
    APIKey.objects.filter(pk=valid_key.api_key.pk).update(last_used_at=long_ago)
    valid_key.api_key.refresh_from_db()

    with django_assert_num_queries(1):
        assert async_to_sync(touch_last_used)(valid_key.api_key) is True

    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.last_used_at > long_ago + timedelta(minutes=4)
