"""``/v1/organization/users``: the organization's members (role ``owner`` = staff), OpenAI's list pagination."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model

from tests.admin_api import delete, get, post
from tests.inprocess_api import body
from tests.inprocess_api import post as complete

pytestmark = pytest.mark.django_db

User = get_user_model()


def uid(user) -> str:
    return f"user_{user.pk}"


@pytest.fixture
def many_users(db, staff_user):
    """Sam (staff) and 24 readers, created in order: 25 users."""
    return [staff_user, *(User.objects.create_user(username=f"reader{i:02}") for i in range(24))]


def test_a_user_is_openais_user_object(admin_key, user):
    user.first_name, user.last_name, user.email = "Alice", "Liddell", "alice@example.org"
    user.save()

    answer = get(f"/users/{uid(user)}", admin_key.plaintext)

    assert answer.status == 200
    assert answer.body == {
        "object": "organization.user",
        "id": uid(user),
        "name": "Alice Liddell",
        "email": "alice@example.org",
        "role": "reader",
        "added_at": int(user.date_joined.timestamp()),
        "username": "alice",
    }


def test_staff_are_owners(admin_key, staff_user):
    assert get(f"/users/{uid(staff_user)}", admin_key.plaintext).body["role"] == "owner"


def test_the_list_pages_with_a_default_of_20(admin_key, many_users):
    first = get("/users", admin_key.plaintext).body

    assert first["object"] == "list" and len(first["data"]) == 20 and first["has_more"] is True
    assert [u["id"] for u in first["data"]] == [uid(u) for u in many_users[:20]]
    assert (first["first_id"], first["last_id"]) == (uid(many_users[0]), uid(many_users[19]))

    rest = get("/users", admin_key.plaintext, after=first["last_id"]).body

    assert [u["id"] for u in rest["data"]] == [uid(u) for u in many_users[20:]]
    assert rest["has_more"] is False


def test_a_page_that_ends_exactly_at_the_last_user_has_no_more(admin_key, many_users):
    page = get("/users", admin_key.plaintext, limit=25).body

    assert len(page["data"]) == 25 and page["has_more"] is False


def test_after_the_last_user_is_an_empty_page(admin_key, many_users):
    page = get("/users", admin_key.plaintext, after=uid(many_users[-1])).body

    assert page == {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}


def test_order_desc_lists_the_newest_first(admin_key, many_users):
    page = get("/users", admin_key.plaintext, limit=2, order="desc").body
    following = get("/users", admin_key.plaintext, limit=2, order="desc", after=page["last_id"]).body

    assert [u["id"] for u in page["data"] + following["data"]] == [uid(u) for u in many_users[::-1][:4]]


@pytest.mark.parametrize(
    ("limit", "code"),
    [
        ("0", "integer_below_min_value"),
        ("101", "integer_above_max_value"),
        ("ten", "invalid_type"),
        ("", "invalid_type"),
    ],
)
def test_a_limit_out_of_bounds_names_limit(admin_key, limit, code):
    answer = get("/users", admin_key.plaintext, limit=limit)

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == ("limit", code)


@pytest.mark.parametrize("limit", ["1", "100"])
def test_the_limits_bounds_are_accepted(admin_key, many_users, limit):
    page = get("/users", admin_key.plaintext, limit=limit).body

    assert len(page["data"]) == min(int(limit), 25)


@pytest.mark.parametrize("after", ["user_999999", "user_x", "key_abcdefgh", "nothing"])
def test_after_an_unknown_id_names_after(admin_key, after):
    answer = get("/users", admin_key.plaintext, after=after)

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == ("after", "invalid_value")


def test_before_is_unsupported_naming_it(admin_key, user):
    answer = get("/users", admin_key.plaintext, before=f"user_{user.pk}")

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == ("before", "unsupported_parameter")


def test_an_unknown_order_names_order(admin_key):
    answer = get("/users", admin_key.plaintext, order="newest")

    assert answer.status == 400 and answer.error["param"] == "order"


def test_creating_a_user_with_a_password_lets_them_log_in(admin_key, client):
    answer = post(
        "/users",
        admin_key.plaintext,
        {"username": "carol", "email": "carol@example.org", "name": "Carol Ann", "password": "a-long-pass-phrase"},
    )

    assert answer.status == 200
    assert answer.body["object"] == "organization.user" and answer.body["role"] == "reader"
    assert answer.body["name"] == "Carol Ann" and answer.body["username"] == "carol"
    assert "password" not in answer.body
    assert client.login(username="carol", password="a-long-pass-phrase")


def test_a_user_created_without_a_password_cannot_log_in(admin_key):
    answer = post("/users", admin_key.plaintext, {"username": "dave", "role": "owner"})

    dave = User.objects.get(username="dave")
    assert answer.body["role"] == "owner" and dave.is_staff
    assert not dave.has_usable_password()


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({}, "username", "missing_required_parameter"),
        ({"username": 12}, "username", "invalid_type"),
        ({"username": ""}, "username", "empty_string"),
        ({"username": "x" * 151}, "username", "string_above_max_length"),
        ({"username": "bad name!"}, "username", "invalid_value"),
        ({"username": "alice"}, "username", "invalid_value"),  # taken
        ({"username": "erin", "role": "admin"}, "role", "invalid_value"),
        ({"username": "erin", "email": "not-an-address"}, "email", "invalid_value"),
        ({"username": "erin", "password": "123"}, "password", "invalid_value"),
        ({"username": "erin", "is_staff": True}, None, None),  # unrecognized
        ([], None, "invalid_type"),
    ],
)
def test_an_invalid_new_user_names_the_parameter(admin_key, user, request_body, param, code):
    answer = post("/users", admin_key.plaintext, request_body)

    assert answer.status == 400
    assert (answer.error["param"], answer.error["code"]) == (param, code)
    assert not User.objects.filter(username="erin").exists()


def test_a_body_that_is_not_json_is_openais_parse_error(admin_key, client):
    response = client.post(
        "/v1/organization/users", "{nope", content_type="application/json",
        headers={"Authorization": f"Bearer {admin_key.plaintext}"},
    )  # fmt: skip

    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("We could not parse the JSON body of your request.")


def test_an_unknown_field_is_openais_unrecognized_argument(admin_key):
    answer = post("/users", admin_key.plaintext, {"username": "erin", "superpowers": 1})

    assert answer.error["message"] == "Unrecognized request argument supplied: superpowers"


def test_modifying_the_role_makes_a_reader_an_owner_and_back(admin_key, user):
    promoted = post(f"/users/{uid(user)}", admin_key.plaintext, {"role": "owner"})
    user.refresh_from_db()
    assert promoted.body["role"] == "owner" and user.is_staff

    demoted = post(f"/users/{uid(user)}", admin_key.plaintext, {"role": "reader"})
    user.refresh_from_db()
    assert demoted.body["role"] == "reader" and not user.is_staff


@pytest.mark.parametrize(
    ("request_body", "param", "code"),
    [
        ({}, "role", "missing_required_parameter"),
        ({"role": "member"}, "role", "invalid_value"),
        ({"role": None}, "role", "invalid_type"),
        ({"role": "owner", "role_id": "role_1"}, "role_id", "unsupported_parameter"),
    ],
)
def test_an_invalid_role_update_names_the_parameter(admin_key, user, request_body, param, code):
    answer = post(f"/users/{uid(user)}", admin_key.plaintext, request_body)

    assert answer.status == 400 and (answer.error["param"], answer.error["code"]) == (param, code)


def test_an_admin_key_cannot_demote_or_delete_its_own_owner(admin_key, staff_user):
    assert post(f"/users/{uid(staff_user)}", admin_key.plaintext, {"role": "reader"}).status == 400
    assert delete(f"/users/{uid(staff_user)}", admin_key.plaintext).status == 400
    staff_user.refresh_from_db()
    assert staff_user.is_staff and staff_user.is_active


def test_deleting_a_user_deactivates_them_and_refuses_their_keys_at_once(tiny_api, admin_key, user, valid_key):
    answer = delete(f"/users/{uid(user)}", admin_key.plaintext)

    assert answer.body == {"object": "organization.user.deleted", "id": uid(user), "deleted": True}
    user.refresh_from_db()
    assert not user.is_active and User.objects.filter(pk=user.pk).exists()  # their records stay
    assert complete(valid_key.plaintext, body()).status == 401
    assert get(f"/users/{uid(user)}", admin_key.plaintext).status == 404
    assert uid(user) not in [u["id"] for u in get("/users", admin_key.plaintext).body["data"]]


@pytest.mark.parametrize("user_id", ["user_999999", "alice", "user_", "user_-1"])
def test_an_unknown_user_is_a_404(admin_key, user_id):
    for answer in (
        get(f"/users/{user_id}", admin_key.plaintext),
        post(f"/users/{user_id}", admin_key.plaintext, {"role": "owner"}),
        delete(f"/users/{user_id}", admin_key.plaintext),
    ):
        assert answer.status == 404 and answer.error["type"] == "invalid_request_error"
