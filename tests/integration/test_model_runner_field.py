"""``GET /v1/models`` says, in our extension field ``runner`` of each model object, which runner
serves the model (``llama``: our own forward pass; ``transformers``: transformers' modeling) and why."""

from __future__ import annotations

import pytest

from tests.inprocess_api import MODEL, get

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_model_list_and_the_model_say_which_runner_serves_it(tiny_api, valid_key):
    expected = {"name": "llama", "reason": "model_type llama: the llama family"}  # the tiny Llama
    listing = get(valid_key.plaintext, "/v1/models").body["data"]
    assert [model["runner"] for model in listing] == [expected]
    assert get(valid_key.plaintext, f"/v1/models/{MODEL}").body["runner"] == expected
