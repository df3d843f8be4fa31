"""API keys: how they are made, stored, revoked and expire, and the commands that issue them."""

from __future__ import annotations

import hashlib
import re
from datetime import timedelta
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction
from django.test import AsyncRequestFactory
from django.utils import timezone

from api.auth import authenticate
from keys import models as key_models
from keys.models import APIKey

KEY_SHAPE = re.compile(r"sk-cs-(?P<prefix>[A-Za-z0-9]{8})\.[A-Za-z0-9_-]{43}")


def authenticates(plaintext: str) -> APIKey:
    request = AsyncRequestFactory().post("/v1/completions", headers={"Authorization": f"Bearer {plaintext}"})
    return async_to_sync(authenticate)(request)


def run_command(name: str, *args: str) -> str:
    out = StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


# --- Creation and storage -----------------------------------------------------------------------


def test_a_new_key_has_the_documented_shape_and_its_prefix_is_the_public_part(valid_key):
    match = KEY_SHAPE.fullmatch(valid_key.plaintext)

    assert match
    assert match["prefix"] == valid_key.api_key.prefix


def test_the_plaintext_is_not_stored_in_any_column(valid_key):
    row = APIKey.objects.filter(pk=valid_key.api_key.pk).values().get()
    secret = valid_key.plaintext.split(".", 1)[1]

    for column, value in row.items():
        assert secret not in str(value), column


def test_the_stored_hash_is_the_sha256_of_the_whole_plaintext(valid_key):
    expected = hashlib.sha256(valid_key.plaintext.encode()).hexdigest()

    assert APIKey.objects.get(pk=valid_key.api_key.pk).hashed_key == expected


def test_two_keys_never_share_a_prefix_or_a_secret(user):
    issued = [APIKey.objects.create_key(name=f"k{i}", owner=user) for i in range(20)]

    assert len({api_key.prefix for api_key, _ in issued}) == 20
    assert len({plaintext for _, plaintext in issued}) == 20


def test_the_database_refuses_a_duplicate_prefix(valid_key, user):
    with pytest.raises(IntegrityError), transaction.atomic():
        APIKey.objects.create(name="copy", owner=user, prefix=valid_key.api_key.prefix, hashed_key="0" * 64)


def test_create_key_retries_when_a_fresh_prefix_collides(valid_key, user, monkeypatch):
    taken = valid_key.api_key.prefix
    prefixes = iter([taken, "Fresh123"])
    monkeypatch.setattr(key_models, "generate_prefix", lambda: next(prefixes))

    api_key, plaintext = APIKey.objects.create_key(name="second", owner=user)

    assert api_key.prefix == "Fresh123"
    assert plaintext.startswith("sk-cs-Fresh123.")


# --- Revocation and expiry ----------------------------------------------------------------------


def test_revoking_deactivates_a_key(valid_key):
    assert valid_key.api_key.revoke() is True

    stored = APIKey.objects.get(pk=valid_key.api_key.pk)
    assert stored.is_revoked and not stored.is_active
    assert stored.status == "revoked"


def test_revoking_twice_keeps_the_first_revocation_time(revoked_key):
    first = APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at
    stale_copy = APIKey.objects.get(pk=revoked_key.api_key.pk)
    stale_copy.revoked_at = None  # as if loaded before the revocation

    assert stale_copy.revoke() is False
    assert stale_copy.revoked_at == first
    assert APIKey.objects.get(pk=revoked_key.api_key.pk).revoked_at == first


def test_a_revoked_key_cannot_be_reinstated_by_saving(revoked_key):
    api_key = APIKey.objects.get(pk=revoked_key.api_key.pk)
    api_key.revoked_at = None

    with pytest.raises(ValueError, match="cannot be reinstated"):
        api_key.save()

    assert APIKey.objects.get(pk=api_key.pk).is_revoked


def test_a_key_is_expired_once_its_expiry_has_passed(expired_key, valid_key, user):
    later = APIKey.objects.create_key(name="later", owner=user, expires_at=timezone.now() + timedelta(days=1))[0]

    assert expired_key.api_key.is_expired and not expired_key.api_key.is_active
    assert expired_key.api_key.status == "expired"
    assert not later.is_expired and later.is_active
    assert not valid_key.api_key.is_expired  # no expiry: never expires


def test_revocation_wins_over_expiry_in_the_status(expired_key):
    expired_key.api_key.revoke()

    assert expired_key.api_key.status == "revoked"


def test_the_status_querysets_partition_the_keys(valid_key, revoked_key, expired_key):
    assert set(APIKey.objects.active()) == {valid_key.api_key}
    assert set(APIKey.objects.revoked()) == {revoked_key.api_key}
    assert set(APIKey.objects.expired()) == {expired_key.api_key}


def test_deleting_a_user_deletes_their_keys(valid_key, user):
    user.delete()

    assert not APIKey.objects.filter(pk=valid_key.api_key.pk).exists()


# --- create_api_key -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_create_api_key_prints_a_working_key_alone_on_its_last_line(user):
    output = run_command("create_api_key", "--name", "ci", "--user", "alice")

    last_line = output.rstrip("\n").splitlines()[-1]
    assert KEY_SHAPE.fullmatch(last_line)
    api_key = authenticates(last_line)
    assert (api_key.name, api_key.owner.username) == ("ci", "alice")


@pytest.mark.django_db
def test_create_api_key_defaults_to_the_first_superuser(staff_user, user):
    run_command("create_api_key", "--name", "ops")

    assert APIKey.objects.get(name="ops").owner == staff_user


@pytest.mark.django_db
def test_create_api_key_without_a_superuser_is_an_error(user):
    with pytest.raises(CommandError, match="no superuser"):
        run_command("create_api_key", "--name", "ops")
    assert not APIKey.objects.exists()


@pytest.mark.django_db
def test_create_api_key_for_an_unknown_user_is_an_error(user):
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        run_command("create_api_key", "--name", "ops", "--user", "nobody")
    assert not APIKey.objects.exists()


# --- bootstrap ----------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_bootstrap_on_an_empty_database_creates_an_admin_and_a_key_and_prints_them_once(monkeypatch):
    monkeypatch.delenv("HOST", raising=False)
    monkeypatch.delenv("PORT", raising=False)

    output = run_command("bootstrap")

    admin = get_user_model().objects.get()
    assert admin.username == "admin" and admin.is_superuser and admin.is_staff
    password = re.search(r"Password:\s+(\S+)", output)[1]
    assert admin.check_password(password)
    assert password not in admin.password  # stored hashed
    plaintext = re.search(r"API key:\s+(\S+)", output)[1]
    api_key = authenticates(plaintext)
    assert (api_key.name, api_key.owner) == ("default", admin)
    assert "http://127.0.0.1:8000/admin/" in output
    assert "curl http://127.0.0.1:8000/v1/completions" in output
    assert f"Authorization: Bearer {plaintext}" in output
    assert '"model": "smollm2-135m-instruct"' in output


@pytest.mark.django_db
def test_bootstraps_example_names_the_first_model_of_models_config(settings, tmp_path):
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nid = "small-fast"\npath = "embedded"\n[[models]]\nid = "big"\npath = "embedded"\n')
    settings.MODELS_CONFIG = str(config)

    assert '"model": "small-fast"' in run_command("bootstrap")


@pytest.mark.django_db
def test_bootstraps_example_names_model_id_when_models_config_cannot_be_served(settings, tmp_path):
    # The welcome's curl is pasted into a shell: an id the reader refuses never reaches it.
    config = tmp_path / "models.toml"
    config.write_text('[[models]]\nid = "it\'s"\npath = "embedded"\n')
    settings.MODELS_CONFIG, settings.MODEL_ID = str(config), "solo"

    assert '"model": "solo"' in run_command("bootstrap")


@pytest.mark.django_db
def test_bootstrap_uses_host_and_port_from_the_environment(monkeypatch):
    monkeypatch.setenv("HOST", "192.168.1.20")
    monkeypatch.setenv("PORT", "9001")

    output = run_command("bootstrap")

    assert "http://192.168.1.20:9001/admin/" in output
    assert "curl http://192.168.1.20:9001/v1/completions" in output


@pytest.mark.django_db
def test_bootstrap_writes_an_ipv6_host_in_brackets(monkeypatch):
    monkeypatch.setenv("HOST", "::1")

    assert "curl http://[::1]:8000/v1/completions" in run_command("bootstrap")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("allowed_hosts", "address"),
    [(["api.example.com", "localhost"], "api.example.com"), ([".example.com", "*"], "127.0.0.1")],
)
def test_bootstrap_on_every_address_names_the_host_the_server_accepts(monkeypatch, settings, allowed_hosts, address):
    # HOST=0.0.0.0 is no address to call, and Host 127.0.0.1 is refused unless ALLOWED_HOSTS has it.
    monkeypatch.setenv("HOST", "0.0.0.0")
    monkeypatch.setenv("PORT", "9001")
    settings.ALLOWED_HOSTS = allowed_hosts

    output = run_command("bootstrap")

    assert f"http://{address}:9001/admin/" in output
    assert f"curl http://{address}:9001/v1/completions" in output


@pytest.mark.django_db
def test_a_second_bootstrap_creates_nothing_and_explains_how_to_add_keys():
    first = run_command("bootstrap")
    plaintext = re.search(r"API key:\s+(\S+)", first)[1]

    second = run_command("bootstrap")

    assert get_user_model().objects.count() == 1
    assert APIKey.objects.count() == 1
    assert plaintext not in second and "Password" not in second
    assert ".venv/bin/python manage.py create_api_key --name NAME --user USERNAME" in second
    assert "/admin/" in second


@pytest.mark.django_db
def test_bootstrap_leaves_an_existing_installation_alone(user):
    output = run_command("bootstrap")

    assert list(get_user_model().objects.values_list("username", flat=True)) == ["alice"]
    assert not APIKey.objects.exists()
    assert "create_api_key" in output
