"""Admin keys' scopes: an ``owner`` key may do everything, a ``read_only`` key may only read.

The scope is chosen when the key is created (the API, ``manage.py create_admin_key``, the admin),
is shown wherever the key is, and existing keys became owners.  A read-only key's change, anywhere
in the Administration API, is OpenAI's 403 ``insufficient_permissions`` and changes nothing.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.urls import reverse

from keys.models import APIKey
from organization.models import AdminAPIKey, Scope
from tests.admin_api import call, get, post
from tests.conftest import issue

pytestmark = pytest.mark.django_db

CHANGES = ("POST", "PATCH", "PUT", "DELETE")
REFUSED = {
    "message": "You have insufficient permissions for this operation: this admin key is read-only, so it may only "
    "read (GET). Use an admin key with the owner scope.",
    "type": "invalid_request_error",
    "param": None,
    "code": "insufficient_permissions",
}


@pytest.fixture
def alices_key(user):
    return issue(user, "alice's app")


def routes(user, api_key: APIKey, admin_key: AdminAPIKey) -> list[str]:
    """Every route of the Administration API, naming objects that exist."""
    project = f"/projects/user_{user.pk}"
    return [
        "/admin_api_keys",
        f"/admin_api_keys/key_{admin_key.prefix}",
        "/users",
        f"/users/user_{user.pk}",
        f"{project}/api_keys",
        f"{project}/api_keys/key_{api_key.prefix}",
        f"{project}/rate_limits",
        f"{project}/rate_limits/rl_{api_key.prefix}",
        "/audit_logs",
        "/usage/completions",
    ]


def state() -> tuple:
    """What a change could alter: every key, user and admin key, as rows."""
    return (
        sorted(APIKey.objects.values_list("prefix", "name", "revoked_at", "rpm_limit")),
        sorted(get_user_model().objects.values_list("username", "is_staff", "is_active")),
        sorted(AdminAPIKey.objects.values_list("prefix", "scope", "revoked_at")),
    )


@pytest.mark.parametrize("method", CHANGES)
def test_a_read_only_key_changes_nothing_anywhere(read_only_admin_key, admin_key, user, alices_key, method):
    before = state()
    bodies = {"name": "x", "role": "owner", "username": "eve", "max_requests_per_1_minute": 1}

    for path in routes(user, alices_key.api_key, admin_key.admin_key):
        answer = call(method, path, read_only_admin_key.plaintext, bodies)

        assert (answer.status, answer.error) == (403, REFUSED), (method, path)
    assert state() == before


def test_the_same_changes_with_an_owner_key_are_not_refused(admin_key, user, alices_key):
    project = f"/projects/user_{user.pk}"
    prefix = alices_key.api_key.prefix

    answers = [
        post(f"{project}/rate_limits/rl_{prefix}", admin_key.plaintext, {"max_requests_per_1_minute": 1}),
        post(f"{project}/api_keys/key_{prefix}", admin_key.plaintext, {"name": "renamed"}),
        call("DELETE", f"{project}/api_keys/key_{prefix}", admin_key.plaintext),
        post("/users", admin_key.plaintext, {"username": "eve", "role": "reader"}),
    ]

    assert [answer.status for answer in answers] == [200, 200, 200, 200]


def test_a_read_only_key_reads_every_route(read_only_admin_key, admin_key, user, alices_key):
    for path in routes(user, alices_key.api_key, admin_key.admin_key):
        query = {"start_time": 0} if path == "/usage/completions" else {}
        if path.startswith(f"/projects/user_{user.pk}/rate_limits/"):
            continue  # a rate limit is changed (POST), never read alone
        answer = get(path, read_only_admin_key.plaintext, **query)

        assert answer.status == 200, (path, answer.body)


def test_the_refusal_comes_before_the_body_is_read(read_only_admin_key):
    answer = call("POST", "/admin_api_keys", read_only_admin_key.plaintext)  # no body at all

    assert (answer.status, answer.error) == (403, REFUSED)


@pytest.mark.parametrize("scope", ["owner", "read_only"])
def test_a_read_only_key_creates_no_key_of_any_scope(read_only_admin_key, scope):
    answer = post("/admin_api_keys", read_only_admin_key.plaintext, {"name": "escalate", "scope": scope})

    assert (answer.status, answer.error["code"]) == (403, "insufficient_permissions")
    assert not AdminAPIKey.objects.filter(name="escalate").exists()


def test_an_owner_key_creates_a_read_only_key_that_reads_but_cannot_change(admin_key):
    created = post("/admin_api_keys", admin_key.plaintext, {"name": "dashboards", "scope": "read_only"}).body

    assert created["scope"] == "read_only"
    assert get("/users", created["value"]).status == 200
    assert post("/users", created["value"], {"username": "eve", "role": "reader"}).status == 403
    assert call("DELETE", f"/admin_api_keys/{created['id']}", created["value"]).status == 403
    assert get(f"/admin_api_keys/{created['id']}", admin_key.plaintext).status == 200


def test_a_key_created_without_a_scope_is_an_owner(admin_key):
    created = post("/admin_api_keys", admin_key.plaintext, {"name": "ops"}).body

    assert created["scope"] == "owner"
    assert post("/users", created["value"], {"username": "eve", "role": "reader"}).status == 200


def test_the_scope_is_shown_in_the_list_and_the_key(admin_key, read_only_admin_key):
    listed = {key["id"]: key["scope"] for key in get("/admin_api_keys", read_only_admin_key.plaintext).body["data"]}
    one = get(f"/admin_api_keys/key_{read_only_admin_key.admin_key.prefix}", admin_key.plaintext).body

    assert listed == {
        f"key_{admin_key.admin_key.prefix}": "owner",
        f"key_{read_only_admin_key.admin_key.prefix}": "read_only",
    }
    assert one["scope"] == "read_only"


@pytest.mark.parametrize(("scope", "code"), [("admin", "invalid_value"), ("", "invalid_value"), (1, "invalid_type")])
def test_an_unknown_scope_is_a_400_naming_it(admin_key, scope, code):
    answer = post("/admin_api_keys", admin_key.plaintext, {"name": "k", "scope": scope})

    assert (answer.status, answer.error["param"], answer.error["code"]) == (400, "scope", code)
    assert AdminAPIKey.objects.count() == 1


def test_a_scope_grants_its_own_and_lower_scopes_only(admin_key, read_only_admin_key):
    assert admin_key.admin_key.may_grant(Scope.OWNER) and admin_key.admin_key.may_grant(Scope.READ_ONLY)
    assert read_only_admin_key.admin_key.may_grant(Scope.READ_ONLY)
    assert not read_only_admin_key.admin_key.may_grant(Scope.OWNER)


def test_the_command_creates_a_read_only_key(staff_user):
    out = StringIO()
    call_command("create_admin_key", "--name", "grafana", "--scope", "read_only", stdout=out)

    plaintext = out.getvalue().strip().splitlines()[-1]
    assert "read-only admin key" in out.getvalue()
    assert AdminAPIKey.objects.get(name="grafana").scope == "read_only"
    assert get("/users", plaintext).status == 200
    assert post("/users", plaintext, {"username": "eve", "role": "reader"}).status == 403


def test_the_command_creates_an_owner_key_by_default(staff_user):
    call_command("create_admin_key", "--name", "ops", stdout=StringIO())

    assert AdminAPIKey.objects.get(name="ops").scope == "owner"


def test_staff_choose_the_scope_in_the_admin_and_see_it_listed(client, staff_user):
    client.force_login(staff_user)

    client.post(
        reverse("admin:organization_adminapikey_add"),
        {"name": "grafana", "owner": staff_user.pk, "scope": "read_only", "expires_at_0": "", "expires_at_1": ""},
    )

    key = AdminAPIKey.objects.get(name="grafana")
    assert key.scope == "read_only"
    listing = client.get(reverse("admin:organization_adminapikey_changelist")).content.decode()
    assert "read-only" in listing
    change_page = client.get(reverse("admin:organization_adminapikey_change", args=[key.pk])).content.decode()
    assert 'name="scope"' not in change_page  # chosen at creation, shown read-only afterwards


@pytest.mark.django_db(transaction=True)
def test_keys_that_existed_before_scopes_become_owners(staff_user):
    executor = MigrationExecutor(connection)
    executor.migrate([("organization", "0001_initial")])
    old_apps = executor.loader.project_state([("organization", "0001_initial")]).apps
    old_apps.get_model("organization", "AdminAPIKey").objects.create(
        name="old", owner_id=staff_user.pk, prefix="oldkey01", hashed_key="0" * 64
    )

    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes("organization"))

    assert AdminAPIKey.objects.get(prefix="oldkey01").scope == "owner"
