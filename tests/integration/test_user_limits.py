"""Per-user limits bind across all of a user's keys, beside each key's own, on both counter stores.

The user's counters are a second scope beside the key's (``keys.limits.decision.Scope``): two keys
of one user share them; another user's keys do not.  The 429 says whose limit was hit.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync

from api.auth import admit
from api.translate import LimitExceeded
from keys import limits
from keys.models import UserLimits
from tests.conftest import issue

pytestmark = pytest.mark.django_db(transaction=True)

UNLIMITED = {"rpm_limit": 0, "tpm_limit": 0, "max_concurrent": 0, "monthly_token_quota": 0}


@pytest.fixture
def two_keys(user):
    """Two of Alice's keys without limits of their own."""
    return issue(user, "first", **UNLIMITED).api_key, issue(user, "second", **UNLIMITED).api_key


def limit_user(user, **fields) -> None:
    UserLimits.objects.update_or_create(user=user, defaults=fields)


def run(*steps):
    """Admit ``(api_key, tokens)`` in order; the admissions, or the first refusal (a ``LimitExceeded``)."""

    async def scenario():
        admitted = []
        for index, (api_key, tokens) in enumerate(steps):
            try:
                admitted.append(await admit(api_key, f"cmpl-{index}", tokens))
            except LimitExceeded as refused:
                return admitted, refused
        return admitted, None

    return async_to_sync(scenario)()


def test_the_users_rpm_binds_across_two_keys(user, two_keys, limits_store):
    limit_user(user, rpm_limit=2)
    first, second = two_keys

    admitted, refused = run((first, 1), (second, 1), (first, 1))

    assert len(admitted) == 2 and refused is not None
    assert (refused.status, refused.type, refused.code) == (429, "requests", "rate_limit_exceeded")
    assert "requests per min (RPM) on your account (all of its API keys together): Limit 2, Used 2" in refused.message


def test_the_users_tpm_binds_across_two_keys(user, two_keys, limits_store):
    limit_user(user, tpm_limit=100)
    first, second = two_keys

    admitted, refused = run((first, 60), (second, 60))

    assert len(admitted) == 1 and refused.type == "tokens"
    assert "tokens per min (TPM) on your account (all of its API keys together): Limit 100, Used 60" in refused.message
    assert refused.headers["x-ratelimit-limit-tokens"] == "100"


def test_the_users_concurrency_binds_across_two_keys(user, two_keys, limits_store):
    limit_user(user, max_concurrent=1)
    first, second = two_keys

    admitted, refused = run((first, 1), (second, 1))

    assert len(admitted) == 1
    assert "concurrent requests on your account (all of its API keys together): Limit 1, Used 1" in refused.message

    async def settle_then_admit():
        await admitted[0].settle(1)
        return await admit(second, "cmpl-after", 1)

    assert async_to_sync(settle_then_admit)().settled is False  # a slot freed: admitted


def test_the_users_monthly_quota_binds_across_two_keys(user, two_keys, limits_store):
    limit_user(user, monthly_token_quota=50)
    first, second = two_keys

    admitted, refused = run((first, 30), (second, 30))

    assert len(admitted) == 1
    assert (refused.type, refused.code, refused.headers["x-should-retry"]) == (
        "insufficient_quota",
        "insufficient_quota",
        "false",
    )
    assert "your account (all of its API keys together) may use 50 tokens per calendar month, 30 are used" in (
        refused.message
    )


def test_the_key_limit_is_named_as_the_keys_when_it_binds_first(user, limits_store):
    limit_user(user, rpm_limit=10)
    tight = issue(user, "tight", rpm_limit=1, tpm_limit=0).api_key

    _, refused = run((tight, 1), (tight, 1))

    assert "requests per min (RPM) on this API key: Limit 1, Used 1" in refused.message


def test_another_users_keys_do_not_count_against_a_user(user, other_user, two_keys, limits_store):
    limit_user(user, rpm_limit=1)
    bobs = issue(other_user, "bob", **UNLIMITED).api_key

    admitted, refused = run((bobs, 1), (bobs, 1), (two_keys[0], 1))

    assert len(admitted) == 3 and refused is None


def test_the_user_defaults_come_from_the_settings_and_a_row_overrides_them(user, settings):
    settings.API_USER_DEFAULT_RPM, settings.API_USER_DEFAULT_TPM = 5, 500

    assert limits.Limits.of_user(None) == limits.Limits(rpm=5, tpm=500)
    own = UserLimits(user=user, rpm_limit=0, tpm_limit=None, monthly_token_quota=7)
    assert limits.Limits.of_user(own) == limits.Limits(rpm=0, tpm=500, monthly_tokens=7)


def test_the_users_limits_load_with_the_key_in_the_one_authentication_query(user, two_keys, django_assert_num_queries):
    from keys.auth import _find_key

    limit_user(user, rpm_limit=3)
    with django_assert_num_queries(1):
        found = _find_key(two_keys[0].prefix)
        assert limits.Limits.of_user(found.owner.limits).rpm == 3
