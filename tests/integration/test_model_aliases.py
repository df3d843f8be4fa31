"""``MODEL_ALIASES``: other names the served model answers to, counted under the served model."""

from __future__ import annotations

import pytest

from tests.inprocess_api import MODEL, body, get, post

pytestmark = pytest.mark.django_db(transaction=True)

ALIAS = "gpt-3.5-turbo-instruct"


@pytest.fixture
def aliased_api(tiny_api, settings):
    settings.MODEL_ALIASES = [ALIAS, "gpt-4o-mini"]
    return tiny_api


def test_the_model_list_shows_the_model_and_its_aliases(aliased_api, valid_key):
    reply = get(valid_key.plaintext, "/v1/models")

    assert [model["id"] for model in reply.body["data"]] == [MODEL, ALIAS, "gpt-4o-mini"]
    assert get(valid_key.plaintext, f"/v1/models/{ALIAS}").body["id"] == ALIAS


def test_an_alias_is_served_by_the_model_and_counted_under_it(aliased_api, valid_key):
    from keys.models import UsageRecord

    reply = post(valid_key.plaintext, body(model=ALIAS))

    assert reply.status == 200 and reply.body["model"] == MODEL
    assert UsageRecord.objects.get(request_id=reply.request_id).model == MODEL


def test_a_name_that_is_no_alias_is_still_not_found(aliased_api, valid_key):
    assert post(valid_key.plaintext, body(model="gpt-4")).status == 404


def test_a_key_may_name_an_alias_in_its_allowed_models(aliased_api, user):
    from tests.conftest import issue

    alias_only = issue(user, "alias only", allowed_models=ALIAS)

    assert post(alias_only.plaintext, body(model=ALIAS)).status == 200
    assert post(alias_only.plaintext, body(model="gpt-4o-mini")).status == 404
    assert [model["id"] for model in get(alias_only.plaintext, "/v1/models").body["data"]] == [ALIAS]


def test_a_key_allowed_the_model_may_use_its_aliases(aliased_api, user):
    from tests.conftest import issue

    model_only = issue(user, "model only", allowed_models=MODEL)

    assert post(model_only.plaintext, body(model="gpt-4o-mini")).status == 200


def test_without_aliases_only_the_model_is_listed(tiny_api, valid_key):
    assert [model["id"] for model in get(valid_key.plaintext, "/v1/models").body["data"]] == [MODEL]
