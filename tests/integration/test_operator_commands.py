"""The operator's commands: keys with limits (create_api_key), revocation (revoke_api_key), the rollup rebuild."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.test import AsyncRequestFactory
from django.utils import timezone

from api.auth import authenticate
from api.errors import APIError
from keys.limits import Limits
from keys.models import APIKey

pytestmark = pytest.mark.django_db


def run(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def created(*args: str) -> tuple[APIKey, str]:
    plaintext = run("create_api_key", "--name", "ops", "--user", "alice", *args).splitlines()[-1]
    return APIKey.objects.get(name="ops"), plaintext


def test_create_api_key_sets_every_limit_given(user):
    api_key, _ = created("--rpm", "10", "--tpm", "20000", "--max-concurrent", "2", "--monthly-tokens", "1000000")

    assert (api_key.rpm_limit, api_key.tpm_limit, api_key.max_concurrent, api_key.monthly_token_quota) == (
        10,
        20000,
        2,
        1000000,
    )


def test_a_key_created_without_limits_follows_the_defaults(user, settings):
    api_key, _ = created()
    settings.API_DEFAULT_RPM = 42

    assert (api_key.rpm_limit, api_key.tpm_limit, api_key.max_concurrent, api_key.monthly_token_quota) == (
        None,
        None,
        None,
        None,
    )
    assert Limits.of(api_key).rpm == 42


def test_a_limit_of_zero_is_no_limit(user, settings):
    api_key, _ = created("--rpm", "0")

    assert Limits.of(api_key).rpm == 0


def test_models_restricts_the_key_to_those_models(user):
    api_key, _ = created("--models", "smollm2-135m-instruct, other")

    assert api_key.allowed_models == "smollm2-135m-instruct,other"
    assert api_key.allows_model("other") and not api_key.allows_model("third")


def test_model_limit_gives_the_key_limits_of_its_own_for_each_model(user):
    api_key, _ = created("--model-limit", "big:60:100000", "--model-limit", "org:model:q4::5000")

    assert api_key.model_limits == {"big": {"rpm": 60, "tpm": 100000}, "org:model:q4": {"tpm": 5000}}
    assert api_key.limits_for_model("org:model:q4") == (0, 5000)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("90m", timedelta(minutes=90)),
        ("2w", timedelta(weeks=2)),
        ("45s", timedelta(seconds=45)),
    ],
)
def test_expires_in_sets_the_expiry_from_now(user, text, expected):
    api_key, _ = created("--expires-in", text)

    assert abs(api_key.expires_at - (timezone.now() + expected)) < timedelta(seconds=10)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--expires-in", "30"], "not a duration"),
        (["--expires-in", "0d"], "not a duration"),
        (["--expires-in", "3y"], "not a duration"),
        (["--rpm", "-1"], "not a whole number"),
        (["--tpm", "ten"], "not a whole number"),
        (["--models", "a b"], "separate model ids with commas"),
        (["--models", "m" * 1001], "at most 1000 characters"),
        (["--model-limit", "big:60"], "is not MODEL:RPM:TPM"),
        (["--model-limit", "big:x:5"], "is not MODEL:RPM:TPM"),
        (["--model-limit", "a b:1:2"], "is not a model id"),
        (["--expires-in", "3000000d"], "before the year 10000"),
        (["--expires-in", "99999999999d"], "before the year 10000"),
    ],
)
def test_bad_settings_are_refused_and_create_nothing(user, args, message):
    with pytest.raises(CommandError, match=message):
        created(*args)

    assert not APIKey.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_key_created_with_an_expiry_in_the_past_does_not_authenticate_once_expired(user):
    api_key, plaintext = created("--expires-in", "1s")
    APIKey.objects.filter(pk=api_key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    with pytest.raises(APIError) as refused:
        authenticate_with(plaintext)

    assert refused.value.status == 401 and refused.value.code == "invalid_api_key"


def authenticate_with(plaintext: str) -> APIKey:
    request = AsyncRequestFactory().post("/v1/completions", headers={"Authorization": f"Bearer {plaintext}"})
    return async_to_sync(authenticate)(request)


@pytest.mark.django_db(transaction=True)
def test_revoke_api_key_revokes_the_key_with_that_prefix_and_no_other(valid_key, other_users_key):
    output = run("revoke_api_key", valid_key.api_key.prefix)

    assert "Revoked API key “alice laptop” of alice" in output
    assert APIKey.objects.get(pk=valid_key.api_key.pk).is_revoked
    assert APIKey.objects.get(pk=other_users_key.api_key.pk).is_active
    with pytest.raises(APIError):
        authenticate_with(valid_key.plaintext)  # on the very next request


def test_revoke_api_key_takes_the_whole_key_too(valid_key):
    run("revoke_api_key", valid_key.plaintext)

    assert APIKey.objects.get(pk=valid_key.api_key.pk).is_revoked


def test_revoking_a_revoked_key_says_so_and_keeps_the_first_time(revoked_key):
    first = APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at

    output = run("revoke_api_key", revoked_key.api_key.prefix)

    assert "was already revoked" in output
    assert APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at == first


def test_revoking_an_unknown_prefix_is_an_error(valid_key):
    with pytest.raises(CommandError, match="No API key has the prefix 'Zz0Zz0Zz'"):
        run("revoke_api_key", "Zz0Zz0Zz")


def test_rebuild_usage_rollup_reports_what_it_rebuilt(valid_key):
    output = run("rebuild_usage_rollup", "--from", "2026-11-01", "--to", "2026-11-30")

    assert output.strip() == "Rebuilt 0 daily usage rows from 2026-11-01 to 2026-11-30."
