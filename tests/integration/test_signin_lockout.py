"""Sign-in lock-out (django-axes, ``completions_site/signin.py``): after ``SIGNIN_FAILURE_LIMIT``
failures with one username from one address, that pair is refused for ``SIGNIN_LOCKOUT_MINUTES``
on the account login and the admin's alike, and the audit log says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.test import Client
from django.utils import timezone

from audit.models import AuditLogEntry
from keys.ids import user_id

pytestmark = pytest.mark.django_db

ADDRESS, OTHER_ADDRESS = "203.0.113.5", "203.0.113.6"
# (login page, the persona who may sign in there, their password)
PAGES = {
    "account": ("/account/login/", "user", "alice-password-1"),
    "admin": ("/admin/login/", "staff_user", "sam-password-1"),
}


@pytest.fixture(params=PAGES.values(), ids=PAGES.keys())
def page(request):
    """(login URL, the user who signs in there, their password)."""
    url, persona, password = request.param
    return url, request.getfixturevalue(persona), password


def sign_in(url: str, username: str, password: str, address: str = ADDRESS):
    return Client(REMOTE_ADDR=address).post(url, {"username": username, "password": password})


def fail(url: str, username: str, times: int, address: str = ADDRESS) -> list[int]:
    return [sign_in(url, username, "wrong-guess", address).status_code for _ in range(times)]


def signed_in(response) -> bool:
    return response.status_code == 302 and "sessionid" in response.cookies


def failed_entries(code: str) -> list[AuditLogEntry]:
    return [
        e for e in AuditLogEntry.objects.filter(type="login.failed").order_by("pk") if e.details["error_code"] == code
    ]


def test_the_fifth_failure_locks_the_username_at_that_address(page):
    url, user, password = page

    statuses = fail(url, user.username, 5)

    assert statuses == [200, 200, 200, 200, 429]
    refused = sign_in(url, user.username, password)  # the right password no longer helps
    assert refused.status_code == 429 and not signed_in(refused)
    assert refused["Retry-After"] == "900"
    assert b"Too many sign-in attempts" in refused.content
    assert not AuditLogEntry.objects.filter(type="login.succeeded").exists()


def test_the_lock_out_is_in_the_audit_log(page):
    url, user, password = page

    fail(url, user.username, 5)
    sign_in(url, user.username, password)

    assert len(failed_entries("invalid_credentials")) == 5  # the refused try's password was never checked
    locked = failed_entries("locked_out")
    assert len(locked) == 2  # when the lock began, and the refused try
    assert {entry.resource_id for entry in locked} == {user_id(user.pk)}
    assert locked[0].actor["session"]["ip_address"] == ADDRESS
    assert locked[0].details["username"] == user.username
    assert "15 minutes" in locked[0].details["error_message"]


def test_the_same_username_from_another_address_still_signs_in(page):
    url, user, password = page
    fail(url, user.username, 5)

    assert signed_in(sign_in(url, user.username, password, address=OTHER_ADDRESS))


def test_another_username_from_the_same_address_still_signs_in(user, staff_user):
    fail("/account/login/", "mallory", 5)

    assert signed_in(sign_in("/account/login/", user.username, "alice-password-1"))


def test_a_successful_sign_in_forgets_the_failures_before_it(user):
    fail("/account/login/", user.username, 4)
    assert signed_in(sign_in("/account/login/", user.username, "alice-password-1"))

    assert fail("/account/login/", user.username, 4) == [200] * 4


def test_the_lock_lifts_after_the_cool_off(user):
    fail("/account/login/", user.username, 5)
    AccessAttempt.objects.update(attempt_time=timezone.now() - timedelta(minutes=16))

    assert signed_in(sign_in("/account/login/", user.username, "alice-password-1"))


def test_a_failure_limit_of_zero_turns_the_lock_out_off(settings, user):
    settings.AXES_ENABLED = False

    assert fail("/account/login/", user.username, 8) == [200] * 8
    assert signed_in(sign_in("/account/login/", user.username, "alice-password-1"))


def test_a_test_clients_login_without_a_request_is_not_counted(client, user):
    assert client.login(username=user.username, password="alice-password-1")
