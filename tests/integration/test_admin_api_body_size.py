"""A body over the size limit is the 413 that ``/v1/completions`` answers, not Django's 400.

Seen live: a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` answered 400 "Request body exceeded
settings.DATA_UPLOAD_MAX_MEMORY_SIZE." with ``code`` null, naming an internal setting, where
``/v1/completions`` answers 413 ``request_too_large`` with the limit in bytes.
"""

from __future__ import annotations

import json

import pytest
from django.test import AsyncRequestFactory, Client

from api.protocol import body_too_large_error
from organization import views as organization_views
from tests.admin_api import BASE, post

pytestmark = pytest.mark.django_db

LIMIT = 1000


@pytest.fixture
def small_limit(settings):
    settings.API_MAX_BODY_BYTES = settings.DATA_UPLOAD_MAX_MEMORY_SIZE = LIMIT
    return LIMIT


def test_a_body_over_the_limit_is_a_413_request_too_large(admin_key, user, small_limit):
    answer = post(f"/users/user_{user.pk}", admin_key.plaintext, {"role": "owner", "padding": "x" * LIMIT})

    assert answer.status == 413
    assert answer.error == {
        "message": f"The request body is too large: the limit is {LIMIT} bytes.",
        "type": "invalid_request_error",
        "param": None,
        "code": "request_too_large",
    }
    assert answer.body == body_too_large_error(LIMIT).to_dict()
    user.refresh_from_db()
    assert not user.is_staff


def test_a_chunked_body_over_the_limit_is_the_same_413(admin_key, user, small_limit):
    request = AsyncRequestFactory().generic(
        "POST", f"{BASE}/users/user_{user.pk}", json.dumps({"role": "owner", "padding": "x" * LIMIT}),
        content_type="application/json", headers={"Authorization": f"Bearer {admin_key.plaintext}"},
    )  # fmt: skip
    del request.META["CONTENT_LENGTH"]  # what a chunked request's META holds

    response = organization_views.UserViewSet.as_view({"post": "update"})(request, user_id=f"user_{user.pk}")

    assert response.status_code == 413
    assert response.data == body_too_large_error(LIMIT).to_dict()


def test_a_body_of_exactly_the_limit_is_served(admin_key, user, small_limit):
    body = json.dumps({"role": "owner"}).ljust(LIMIT)  # JSON allows trailing whitespace

    response = Client().post(
        f"{BASE}/users/user_{user.pk}", body, content_type="application/json",
        headers={"Authorization": f"Bearer {admin_key.plaintext}"},
    )  # fmt: skip

    assert len(body) == LIMIT and response.status_code == 200, response.content
