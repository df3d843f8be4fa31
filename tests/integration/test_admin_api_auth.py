"""Who may call the Administration API: an admin key there and nowhere else, API keys never."""

from __future__ import annotations

import pytest

from tests.admin_api import call, get
from tests.inprocess_api import body, post

pytestmark = pytest.mark.django_db

# Every route, with a method it answers (the ids exist or not: auth comes first).
ROUTES = [
    ("GET", "/admin_api_keys"),
    ("POST", "/admin_api_keys"),
    ("GET", "/admin_api_keys/key_abcdefgh"),
    ("DELETE", "/admin_api_keys/key_abcdefgh"),
    ("GET", "/users"),
    ("POST", "/users"),
    ("GET", "/users/user_1"),
    ("POST", "/users/user_1"),
    ("DELETE", "/users/user_1"),
    ("GET", "/projects/user_1/api_keys"),
    ("POST", "/projects/user_1/api_keys"),
    ("GET", "/projects/user_1/api_keys/key_abcdefgh"),
    ("POST", "/projects/user_1/api_keys/key_abcdefgh"),
    ("DELETE", "/projects/user_1/api_keys/key_abcdefgh"),
    ("GET", "/projects/user_1/rate_limits"),
    ("POST", "/projects/user_1/rate_limits/rl_abcdefgh"),
    ("GET", "/usage/completions"),
    ("GET", "/audit_logs"),
]
INCORRECT = {"message": "Incorrect API key provided.", "type": "invalid_request_error", "param": None,
             "code": "invalid_api_key"}  # fmt: skip


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_without_a_key_is_openais_401_without_a_code(db, method, path):
    answer = call(method, path, None, {})

    assert answer.status == 401
    assert answer.error["code"] is None and answer.error["type"] == "invalid_request_error"
    assert answer.error["message"].startswith("You didn't provide an API key.")
    assert answer.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_refuses_an_api_key_with_a_403(valid_key, method, path):
    answer = call(method, path, valid_key.plaintext, {})

    assert answer.status == 403
    assert answer.error["code"] == "insufficient_permissions"
    assert "admin key" in answer.error["message"]


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_every_route_refuses_a_revoked_admin_key_as_incorrect(revoked_admin_key, method, path):
    answer = call(method, path, revoked_admin_key.plaintext, {})

    assert (answer.status, answer.error) == (401, INCORRECT)


@pytest.mark.parametrize(
    "token",
    [
        "persona:expired_admin_key",
        "persona:wrong_secret",
        "sk-cs-admin-unknown1.secret",
        "sk-cs-admin-",
        "not-a-key",
    ],
)
def test_every_bad_admin_key_gets_the_same_401(request, admin_key, token):
    if token == "persona:wrong_secret":
        token = admin_key.plaintext[:-3] + "xyz"
    elif token.startswith("persona:"):
        token = request.getfixturevalue(token.removeprefix("persona:")).plaintext

    answer = get("/users", token)

    assert (answer.status, answer.error) == (401, INCORRECT)


@pytest.mark.parametrize("header", ["", "Bearer", "Bearer   ", "Basic abc", "Token sk-cs-admin-x.y"])
def test_no_bearer_token_is_the_missing_key_401(client, admin_key, header):
    response = client.get("/v1/organization/users", headers={"Authorization": header})

    assert response.status_code == 401 and response.json()["error"]["code"] is None


def test_the_scheme_is_case_insensitive_and_spaces_around_the_token_are_ignored(client, admin_key):
    response = client.get("/v1/organization/users", headers={"Authorization": f"bearer   {admin_key.plaintext} "})

    assert response.status_code == 200


def test_an_admin_key_whose_owner_is_no_longer_staff_is_refused(admin_key, staff_user):
    staff_user.is_staff = False
    staff_user.save()

    assert get("/users", admin_key.plaintext).status == 401


def test_an_admin_key_authenticates_the_administration_api(admin_key):
    answer = get("/users", admin_key.plaintext)

    assert answer.status == 200 and answer.body["object"] == "list"


def test_an_admin_key_is_refused_on_the_completions_endpoint(tiny_api, admin_key):
    reply = post(admin_key.plaintext, body())

    assert reply.status == 401 and reply.error["code"] == "invalid_api_key"


def test_the_admin_key_is_the_requests_audit_actor(admin_key, rf):
    from rest_framework.request import Request

    from organization.authentication import AdminKeyAuthentication

    request = Request(rf.get("/v1/organization/users", headers={"Authorization": f"Bearer {admin_key.plaintext}"}))
    user, auth = AdminKeyAuthentication().authenticate(request)

    assert auth == admin_key.admin_key and user == admin_key.admin_key.owner
    assert request.audit_actor == admin_key.admin_key and request._request.audit_actor == admin_key.admin_key


def test_using_an_admin_key_sets_its_last_use(admin_key):
    assert admin_key.admin_key.last_used_at is None

    get("/users", admin_key.plaintext)

    admin_key.admin_key.refresh_from_db()
    assert admin_key.admin_key.last_used_at is not None


def test_authentication_costs_one_query(admin_key, django_assert_num_queries):
    from django.test import RequestFactory
    from django.utils import timezone
    from rest_framework.request import Request

    from organization.authentication import AdminKeyAuthentication

    admin_key.admin_key.__class__.objects.filter(pk=admin_key.admin_key.pk).update(last_used_at=timezone.now())
    request = Request(RequestFactory().get("/", headers={"Authorization": f"Bearer {admin_key.plaintext}"}))
    with django_assert_num_queries(1):
        AdminKeyAuthentication().authenticate(request)


def test_answers_are_json_even_when_a_browser_asks_for_html(client, admin_key):
    response = client.get(
        "/v1/organization/users", headers={"Authorization": f"Bearer {admin_key.plaintext}", "Accept": "text/html"}
    )

    assert response.status_code == 200 and response["Content-Type"] == "application/json"


def test_an_unknown_method_is_a_405_in_openais_shape(admin_key):
    answer = call("PUT", "/users", admin_key.plaintext, {})

    assert answer.status == 405 and answer.error["message"] == "Invalid URL (PUT /v1/organization/users)"


def test_an_unknown_organization_path_is_openais_404(admin_key):
    answer = get("/projects", admin_key.plaintext)

    assert answer.status == 404 and answer.error["message"].startswith("Invalid URL")


@pytest.mark.django_db(transaction=True)
def test_the_routes_work_through_the_apis_asgi_handler_without_middleware(admin_key):
    import json

    from asgiref.sync import async_to_sync
    from asgiref.testing import ApplicationCommunicator

    from api.handlers import APIHandler

    async def call() -> tuple[int, dict]:
        scope = {
            "type": "http", "http_version": "1.1", "method": "POST", "path": "/v1/organization/users",
            "raw_path": b"/v1/organization/users", "query_string": b"", "root_path": "", "scheme": "http",
            "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"), (b"content-length", b"20"),
                        (b"authorization", f"Bearer {admin_key.plaintext}".encode())],
            "server": ("localhost", 80), "client": ("127.0.0.1", 5000),
        }  # fmt: skip
        communicator = ApplicationCommunicator(APIHandler(), scope)
        await communicator.send_input({"type": "http.request", "body": b'{"username": "asgi"}'})
        start = await communicator.receive_output(10)
        body = await communicator.receive_output(10)
        return start["status"], json.loads(body["body"])

    status, answer = async_to_sync(call)()

    assert (status, answer.get("username")) == (200, "asgi"), answer
