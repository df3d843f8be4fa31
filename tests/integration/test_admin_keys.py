"""The admin site for keys and usage records, driven through Django's test client as Sam (staff).

The project's root URLconf belongs to the API; these tests mount the admin alone so that they
test the admin and nothing else.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib import admin
from django.urls import path, reverse
from django.utils import timezone

from keys.models import APIKey, DailyUsage, UsageRecord, hash_key
from tests.usage_helpers import KEY_IN_TEXT

urlpatterns = [path("admin/", admin.site.urls)]
pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture
def staff_client(client, staff_user):
    client.force_login(staff_user)
    return client


@pytest.fixture
def usage_record(valid_key) -> UsageRecord:
    return UsageRecord.objects.create(
        api_key=valid_key.api_key,
        owner=valid_key.api_key.owner,
        model="smollm2-135m-instruct",
        request_id="cmpl-test0001",
        prompt_tokens=5,
        completion_tokens=7,
        total_tokens=12,
        status_code=200,
        finish_reason="stop",
        latency_ms=12.5,
    )


def add_key(client, user, name="from the admin", **fields):
    return client.post(
        reverse("admin:keys_apikey_add"),
        {"name": name, "owner": user.pk, "expires_at_0": "", "expires_at_1": "", "_save": "Save", **fields},
        follow=True,
    )


# --- Adding a key -------------------------------------------------------------------------------


LIMIT_FIELDS = [
    "rpm_limit",
    "tpm_limit",
    "max_concurrent",
    "monthly_token_quota",
    "budget",
    "budget_period",
    "allowed_models",
    "model_limits",
]


def test_the_add_form_asks_name_owner_expiry_limits_and_models_only(staff_client):
    form = staff_client.get(reverse("admin:keys_apikey_add")).context["adminform"].form

    assert list(form.fields) == ["name", "owner", "expires_at", *LIMIT_FIELDS]


def test_a_key_added_with_limits_keeps_them(staff_client, user):
    add_key(staff_client, user, rpm_limit="10", tpm_limit="5000", monthly_token_quota="0", allowed_models="a, b")

    api_key = APIKey.objects.get(name="from the admin")
    assert (api_key.rpm_limit, api_key.tpm_limit, api_key.max_concurrent, api_key.monthly_token_quota) == (
        10,
        5000,
        None,
        0,
    )
    assert api_key.models == ["a", "b"]


def test_adding_a_key_shows_its_plaintext_exactly_once(staff_client, user):
    response = add_key(staff_client, user)

    api_key = APIKey.objects.get(name="from the admin")
    assert api_key.owner == user
    shown = KEY_IN_TEXT.findall(response.content.decode())
    assert len(shown) == 1
    assert hash_key(shown[0]) == api_key.hashed_key
    assert shown[0].startswith(f"sk-cs-{api_key.prefix}.")
    # The message is consumed: the next page loads do not show it again.
    for url in (reverse("admin:keys_apikey_changelist"), reverse("admin:keys_apikey_change", args=[api_key.pk])):
        assert shown[0] not in staff_client.get(url).content.decode()


def test_changing_a_key_never_reveals_its_secret_or_hash(staff_client, valid_key):
    url = reverse("admin:keys_apikey_change", args=[valid_key.api_key.pk])

    page = staff_client.get(url)
    edit = {"name": "renamed", "expires_at_0": "", "expires_at_1": "", "_save": "Save"}
    saved = staff_client.post(url, edit, follow=True)

    form = page.context["adminform"].form
    assert list(form.fields) == ["name", "expires_at", *LIMIT_FIELDS]  # prefix, owner, hash and times are read-only
    for response in (page, saved):
        text = response.content.decode()
        assert valid_key.plaintext.split(".", 1)[1] not in text
        assert valid_key.api_key.hashed_key not in text
        assert not KEY_IN_TEXT.search(text)
    stored = APIKey.objects.get(pk=valid_key.api_key.pk)
    assert stored.name == "renamed"
    assert (stored.hashed_key, stored.prefix) == (valid_key.api_key.hashed_key, valid_key.api_key.prefix)


def test_limits_models_and_expiry_are_editable_on_an_existing_key(staff_client, valid_key):
    url = reverse("admin:keys_apikey_change", args=[valid_key.api_key.pk])
    edit = {
        "name": "alice laptop",
        "expires_at_0": "2031-01-02",
        "expires_at_1": "03:04:05",
        "rpm_limit": "60",
        "tpm_limit": "",
        "max_concurrent": "2",
        "monthly_token_quota": "100000",
        "allowed_models": "m1,m2",
        "_save": "Save",
    }

    staff_client.post(url, edit, follow=True)

    stored = APIKey.objects.get(pk=valid_key.api_key.pk)
    assert (stored.rpm_limit, stored.tpm_limit, stored.max_concurrent, stored.monthly_token_quota) == (
        60,
        None,
        2,
        100000,
    )
    assert stored.models == ["m1", "m2"]
    assert stored.expires_at.year == 2031


def test_a_model_list_without_commas_is_refused(staff_client, valid_key):
    url = reverse("admin:keys_apikey_change", args=[valid_key.api_key.pk])
    edit = {"name": "alice laptop", "expires_at_0": "", "expires_at_1": "", "allowed_models": "m1 m2", "_save": "Save"}

    response = staff_client.post(url, edit)

    assert "separate model ids with commas" in response.content.decode()
    assert APIKey.objects.get(pk=valid_key.api_key.pk).allowed_models == ""


def test_a_key_added_with_limits_per_model_keeps_them_and_an_empty_box_is_none(staff_client, user):
    add_key(staff_client, user, name="per model", model_limits='{"big": {"rpm": 5, "tpm": 9000}}')
    add_key(staff_client, user, name="none", model_limits="")

    assert APIKey.objects.get(name="per model").model_limits == {"big": {"rpm": 5, "tpm": 9000}}
    assert APIKey.objects.get(name="none").model_limits == {}


def test_limits_per_model_that_are_no_whole_numbers_are_refused(staff_client, valid_key):
    url = reverse("admin:keys_apikey_change", args=[valid_key.api_key.pk])
    edit = {"name": "alice laptop", "expires_at_0": "", "expires_at_1": "", "_save": "Save"}

    response = staff_client.post(url, {**edit, "model_limits": '{"big": {"rpm": -1}}'})

    assert "The rpm of “big” must be a whole number" in response.content.decode()
    assert APIKey.objects.get(pk=valid_key.api_key.pk).model_limits == {}


def test_the_key_list_shows_each_keys_own_limits(staff_client, user):
    issue_with = APIKey.objects.create_key
    issue_with(name="limited", owner=user, rpm_limit=10, monthly_token_quota=0, allowed_models="m1")
    issue_with(name="plain", owner=user)
    issue_with(name="per model", owner=user, model_limits={"big": {"rpm": 5}, "small": {"rpm": 0, "tpm": 70}})

    text = staff_client.get(reverse("admin:keys_apikey_changelist")).content.decode()

    assert "rpm 10; tokens/month unlimited; models: m1" in text
    assert ">defaults<" in text
    assert "big: rpm 5; small: tpm 70" in text


# --- Revoking -----------------------------------------------------------------------------------


def test_the_revoke_action_revokes_the_selected_keys_only(staff_client, valid_key, other_users_key):
    response = staff_client.post(
        reverse("admin:keys_apikey_changelist"),
        {"action": "revoke_selected", "_selected_action": [valid_key.api_key.pk]},
        follow=True,
    )

    assert APIKey.objects.get(pk=valid_key.api_key.pk).is_revoked
    assert APIKey.objects.get(pk=other_users_key.api_key.pk).is_active
    assert "Revoked 1 of 1 selected keys." in response.content.decode()


def test_the_revoke_action_keeps_an_earlier_revocation_time(staff_client, revoked_key):
    first = APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at

    staff_client.post(
        reverse("admin:keys_apikey_changelist"),
        {"action": "revoke_selected", "_selected_action": [revoked_key.api_key.pk]},
    )

    assert APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at == first


# --- Listing and filtering ----------------------------------------------------------------------


@pytest.mark.parametrize("status, expected", [("active", "valid"), ("revoked", "revoked"), ("expired", "expired")])
def test_the_status_filter_lists_only_keys_in_that_status(
    staff_client, valid_key, revoked_key, expired_key, status, expected
):
    personas = {"valid": valid_key, "revoked": revoked_key, "expired": expired_key}

    response = staff_client.get(reverse("admin:keys_apikey_changelist"), {"status": status})

    assert list(response.context["cl"].result_list) == [personas[expected].api_key]


def test_the_list_shows_each_keys_status_and_is_searchable_by_prefix(staff_client, valid_key, revoked_key):
    changelist = reverse("admin:keys_apikey_changelist")

    everything = staff_client.get(changelist).content.decode()
    found = staff_client.get(changelist, {"q": valid_key.api_key.prefix}).context["cl"].result_list

    assert ">active<" in everything and ">revoked<" in everything
    assert list(found) == [valid_key.api_key]


# --- Usage records ------------------------------------------------------------------------------


def test_usage_records_are_listed_and_viewable(staff_client, usage_record):
    listing = staff_client.get(reverse("admin:keys_usagerecord_changelist"))
    detail = staff_client.get(reverse("admin:keys_usagerecord_change", args=[usage_record.pk]))

    assert listing.status_code == 200 and "cmpl-test0001" in listing.content.decode()
    assert detail.status_code == 200
    assert 'name="_save"' not in detail.content.decode()


def test_usage_records_cannot_be_added_changed_or_deleted(staff_client, usage_record):
    change_url = reverse("admin:keys_usagerecord_change", args=[usage_record.pk])
    delete_url = reverse("admin:keys_usagerecord_delete", args=[usage_record.pk])
    tampered = {"model": "tampered", "status_code": 500, "latency_ms": 1}

    assert staff_client.get(reverse("admin:keys_usagerecord_add")).status_code == 403
    assert staff_client.post(change_url, tampered).status_code == 403
    assert staff_client.get(delete_url).status_code == 403
    assert staff_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert UsageRecord.objects.filter(pk=usage_record.pk).exists()
    usage_record.refresh_from_db()
    assert usage_record.model == "smollm2-135m-instruct"


def test_usage_records_offer_no_bulk_delete_action(staff_client, usage_record):
    response = staff_client.get(reverse("admin:keys_usagerecord_changelist"))

    assert "delete_selected" not in response.content.decode()


def test_usage_records_can_be_searched_by_request_id(staff_client, usage_record, valid_key):
    UsageRecord.objects.create(
        api_key=valid_key.api_key,
        model="m",
        request_id="cmpl-other",
        status_code=200,
        latency_ms=1.0,
        created_at=timezone.now() - timedelta(hours=1),
    )

    response = staff_client.get(reverse("admin:keys_usagerecord_changelist"), {"q": "test0001"})
    found = response.context["cl"].result_list

    assert list(found) == [usage_record]


def test_the_daily_rollup_is_listed_but_read_only(staff_client, usage_record):
    DailyUsage.objects.add(usage_record)
    row = DailyUsage.objects.get()

    listing = staff_client.get(reverse("admin:keys_dailyusage_changelist"))

    assert listing.status_code == 200 and "smollm2-135m-instruct" in listing.content.decode()
    assert staff_client.get(reverse("admin:keys_dailyusage_add")).status_code == 403
    assert staff_client.post(reverse("admin:keys_dailyusage_delete", args=[row.pk]), {"post": "yes"}).status_code == 403
