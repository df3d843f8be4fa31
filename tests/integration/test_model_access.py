"""Model access: a key limited to some models gets, for any other, the very 404 of an unknown model."""

from __future__ import annotations

import pytest

from keys.models import parse_model_list
from tests.inprocess_api import MODEL, body, get, post

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tiny_key(user):
    """Alice's key for the served tiny model and one other."""
    from tests.conftest import issue

    return issue(user, "alice tiny", allowed_models=f"{MODEL},other-model")


def without_model_name(error: dict) -> dict:
    return {**error, "message": error["message"].replace("`other-model`", "`X`").replace(f"`{MODEL}`", "`X`")}


def test_a_model_the_key_may_not_use_gets_the_same_404_as_an_unknown_model(tiny_api, restricted_key, valid_key):
    forbidden = post(restricted_key.plaintext, body())
    unknown = post(valid_key.plaintext, body(model="other-model"))

    assert forbidden.status == unknown.status == 404
    assert forbidden.error["code"] == "model_not_found" and forbidden.error["param"] == "model"
    assert forbidden.error["message"] == f"The model `{MODEL}` does not exist or you do not have access to it."
    assert without_model_name(forbidden.error) == without_model_name(unknown.error)


def test_a_key_listing_the_served_model_may_use_it(tiny_api, tiny_key):
    assert post(tiny_key.plaintext, body()).status == 200


def test_a_key_without_a_model_list_may_use_every_model(tiny_api, valid_key):
    assert post(valid_key.plaintext, body()).status == 200


def test_the_model_list_shows_only_the_models_the_key_may_use(tiny_api, restricted_key, tiny_key):
    assert get(restricted_key.plaintext, "/v1/models").body["data"] == []
    assert [m["id"] for m in get(tiny_key.plaintext, "/v1/models").body["data"]] == [MODEL]


def test_a_model_the_key_may_not_use_is_not_found_by_id(tiny_api, restricted_key, tiny_key):
    forbidden = get(restricted_key.plaintext, f"/v1/models/{MODEL}")

    assert forbidden.status == 404 and forbidden.error["code"] == "model_not_found"
    assert get(tiny_key.plaintext, f"/v1/models/{MODEL}").status == 200


def test_a_refused_model_leaves_a_record_without_tokens(tiny_api, restricted_key):
    from keys.models import UsageRecord

    reply = post(restricted_key.plaintext, body())

    record = UsageRecord.objects.get(request_id=reply.request_id)
    assert (record.status_code, record.total_tokens, record.model) == (404, 0, "")


def test_a_key_sent_as_the_model_never_reaches_the_usage_record(tiny_api, valid_key):
    from keys.models import UsageRecord

    pasted = "sk-cs-AbCd1234.Zm9vYmFyYmF6cXV4LXNlY3JldC10b2tlbi0wMTIzNDU2Nzg5"
    reply = post(valid_key.plaintext, body(model=pasted))

    record = UsageRecord.objects.get(request_id=reply.request_id)
    assert reply.status == 404 and record.model == ""


@pytest.mark.parametrize(
    "persona",
    ["revoked_key", "expired_key"],
)
def test_a_revoked_or_expired_key_gets_the_same_401_as_an_unknown_one(tiny_api, persona, request):
    key = request.getfixturevalue(persona)

    refused = post(key.plaintext, body())
    unknown = post("sk-cs-Zz0Zz0Zz.unknownunknownunknownunknownunknownunknown00", body())

    assert refused.status == unknown.status == 401
    assert refused.body == unknown.body
    assert refused.error["code"] == "invalid_api_key"


@pytest.mark.django_db(transaction=False)  # no database needed; the module's mark asks for one
@pytest.mark.parametrize(
    "text, models",
    [("", []), ("a", ["a"]), ("a,b", ["a", "b"]), (" a , b ,, ", ["a", "b"]), ("org/model-7b:q4", ["org/model-7b:q4"])],
)
def test_a_model_list_is_comma_separated(text, models):
    assert parse_model_list(text) == models
