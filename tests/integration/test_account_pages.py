"""Self-service accounts under /account/: a user's own keys and usage, created and revoked by them."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone

from dashboard.models import AccountSettings
from keys.models import APIKey, hash_key
from tests.usage_helpers import KEY_IN_TEXT, add_usage

pytestmark = pytest.mark.django_db

OVERVIEW = "/account/"


@pytest.fixture
def alice(client, user):
    client.force_login(user)
    return client


def create(client, name="laptop", url="/account/keys/create/", **extra):
    return client.post(url, {"name": name, **extra})


def test_the_account_page_needs_a_login(client):
    response = client.get(OVERVIEW)

    assert response.status_code == 302
    assert response["Location"].startswith("/account/login/?next=/account/")


def test_a_user_logs_in_with_their_password(client, user):
    response = client.post("/account/login/", {"username": "alice", "password": "alice-password-1"})

    assert response.status_code == 302 and response["Location"] == OVERVIEW
    assert client.get(OVERVIEW).status_code == 200


def test_creating_a_key_shows_its_plaintext_exactly_once(alice, user):
    response = create(alice)

    assert response.status_code == 201
    shown = KEY_IN_TEXT.findall(response.content.decode())
    assert len(shown) == 1
    api_key = APIKey.objects.get(owner=user, name="laptop")
    assert hash_key(shown[0]) == api_key.hashed_key
    assert "no-store" in response["Cache-Control"]
    again = alice.get(OVERVIEW).content.decode()
    assert shown[0] not in again and f"sk-cs-{api_key.prefix}…" in again


def test_a_key_with_an_expiry_day(alice, user):
    day = (timezone.now() + timedelta(days=10)).date()

    create(alice, expires_on=day.isoformat())

    assert APIKey.objects.get(owner=user).expires_at.date() == day


def test_a_key_needs_a_name_and_a_future_expiry(alice):
    assert create(alice, name="").status_code == 400
    assert create(alice, expires_on=timezone.now().date().isoformat()).status_code == 400
    assert not APIKey.objects.exists()


def test_revoking_asks_first_then_revokes(alice, valid_key):
    url = f"/account/keys/{valid_key.api_key.pk}/revoke/"

    confirm = alice.get(url)
    assert confirm.status_code == 200 and b"Revoke this key" in confirm.content
    valid_key.api_key.refresh_from_db()
    assert not valid_key.api_key.is_revoked

    response = alice.post(url)
    assert response.status_code == 302 and response["Location"] == OVERVIEW
    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.is_revoked
    assert LogEntry.objects.filter(object_id=str(valid_key.api_key.pk), change_message__startswith="Revoked").exists()


def test_the_page_shows_prefix_last_use_limits_and_month_to_date_usage(alice, valid_key):
    valid_key.api_key.last_used_at = timezone.now()
    valid_key.api_key.save()
    add_usage(valid_key.api_key, timezone.now(), prompt_tokens=300, completion_tokens=45)

    page = alice.get(OVERVIEW).content.decode()

    assert f"sk-cs-{valid_key.api_key.prefix}…" in page
    assert "345 tokens" in page
    assert "never" not in page.split(f'id="key-{valid_key.api_key.prefix}"')[1].split("</tr>")[0]
    assert "Requests/min" in page or not hasattr(valid_key.api_key, "rpm_limit")
    assert 'id="chart-usage"' in page and 'id="usage-data"' in page


def test_own_limits_show_instead_of_the_defaults(alice, valid_key):
    if not hasattr(valid_key.api_key, "rpm_limit"):
        pytest.skip("APIKey has no per-key limits yet")
    valid_key.api_key.rpm_limit = 7
    valid_key.api_key.save()

    row = alice.get(OVERVIEW).content.decode().split(f'id="key-{valid_key.api_key.prefix}"')[1].split("</tr>")[0]

    assert "<dt>Requests/min</dt><dd>7</dd>" in row


def test_a_keys_limits_per_model_show_beside_its_others(alice, valid_key):
    valid_key.api_key.model_limits = {"big": {"rpm": 60, "tpm": 100000}, "small": {"tpm": 500}}
    valid_key.api_key.save()

    row = alice.get(OVERVIEW).content.decode().split(f'id="key-{valid_key.api_key.prefix}"')[1].split("</tr>")[0]

    assert "<dt>For big</dt><dd>60 requests/min, 100,000 tokens/min</dd>" in row
    assert "<dt>For small</dt><dd>500 tokens/min</dd>" in row


# --- One user never sees another's ---------------------------------------------------------------


def test_a_user_never_sees_another_users_keys_or_usage(alice, valid_key, other_users_key):
    add_usage(other_users_key.api_key, timezone.now(), prompt_tokens=4321, completion_tokens=1234)

    page = alice.get(OVERVIEW).content.decode()

    assert other_users_key.api_key.prefix not in page
    assert other_users_key.api_key.name not in page
    for figure in ("4321", "4,321", "5555", "5,555"):
        assert figure not in page


def test_a_user_cannot_revoke_another_users_key(alice, other_users_key):
    url = f"/account/keys/{other_users_key.api_key.pk}/revoke/"

    assert alice.get(url).status_code == 404
    assert alice.post(url).status_code == 404
    other_users_key.api_key.refresh_from_db()
    assert not other_users_key.api_key.is_revoked


def test_a_user_cannot_use_the_staff_pages_for_another_account(alice, other_user, other_users_key):
    for url in (
        f"/admin/dashboard/accounts/{other_user.pk}/",
        f"/admin/dashboard/accounts/{other_user.pk}/keys/{other_users_key.api_key.pk}/revoke/",
    ):
        response = alice.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    response = alice.post(f"/admin/dashboard/accounts/{other_user.pk}/keys/create/", {"name": "mine now"})
    assert response.status_code == 302
    assert not APIKey.objects.filter(name="mine now").exists()


# --- Staff act for a user ------------------------------------------------------------------------


def test_staff_see_and_manage_any_users_keys_from_the_admin(client, staff_user, user, valid_key):
    client.force_login(staff_user)
    base = f"/admin/dashboard/accounts/{user.pk}/"

    page = client.get(base).content.decode()
    assert "acting for <strong>alice</strong>" in page and valid_key.api_key.prefix in page

    created = client.post(base + "keys/create/", {"name": "for alice"})
    assert created.status_code == 201 and len(KEY_IN_TEXT.findall(created.content.decode())) == 1
    assert APIKey.objects.get(name="for alice").owner == user

    revoked = client.post(f"{base}keys/{valid_key.api_key.pk}/revoke/")
    assert revoked.status_code == 302 and revoked["Location"] == base
    valid_key.api_key.refresh_from_db()
    assert valid_key.api_key.is_revoked
    assert LogEntry.objects.filter(user=staff_user, change_message__contains="by staff for alice").count() == 2


def test_the_accounts_list_links_to_each_users_page(client, staff_user, user):
    client.force_login(staff_user)

    page = client.get(reverse("dashboard:accounts")).content.decode()

    assert f'href="/admin/dashboard/accounts/{user.pk}/"' in page


# --- Sign-up -------------------------------------------------------------------------------------


SIGNUP = {"username": "carol", "email": "", "password1": "a-long-passphrase-9", "password2": "a-long-passphrase-9"}


def test_self_signup_is_closed_unless_staff_open_it(client):
    assert client.get("/account/signup/").status_code == 404
    assert client.post("/account/signup/", SIGNUP).status_code == 404
    assert b"Sign up" not in client.get("/account/login/").content


def test_when_staff_open_signup_a_visitor_creates_an_account(client, django_user_model):
    settings = AccountSettings.current()
    settings.self_signup = True
    settings.save()

    assert b"Sign up" in client.get("/account/login/").content
    response = client.post("/account/signup/", SIGNUP)

    assert response.status_code == 302 and response["Location"] == OVERVIEW
    carol = django_user_model.objects.get(username="carol")
    assert not carol.is_staff
    assert client.get(OVERVIEW).status_code == 200


def test_staff_turn_signup_on_in_the_admin(client, staff_user):
    client.force_login(staff_user)

    changelist = client.get(reverse("admin:dashboard_accountsettings_changelist"))
    change_url = changelist["Location"]
    client.post(change_url, {"self_signup": "on", "_save": "Save"})

    assert AccountSettings.current().self_signup
