"""A draining process's refusals: 503 server_shutting_down, counted apart from faults."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from django.test import RequestFactory
from prometheus_client import REGISTRY

from api import draining
from api.handlers import APIHandler
from tests.inprocess_api import body, post

pytestmark = pytest.mark.django_db(transaction=True)


def refused_while_draining() -> float:
    return REGISTRY.get_sample_value("completions_http_draining_refused_total") or 0.0


def test_a_submission_to_a_stopping_engine_is_server_shutting_down_not_overloaded(tiny_api, valid_key, monkeypatch):
    before = refused_while_draining()
    monkeypatch.setattr(tiny_api, "_stopping", True)

    refused = post(valid_key.plaintext, body())

    assert refused.status == 503 and refused.error["code"] == "server_shutting_down"
    assert refused_while_draining() == before + 1


def test_a_draining_process_counts_its_refusals_apart(monkeypatch):
    before = refused_while_draining()
    monkeypatch.setattr(draining.state, "draining", True)

    response = async_to_sync(APIHandler()._admitted_response)(RequestFactory().get("/v1/models"))

    assert response.status_code == 503
    assert refused_while_draining() == before + 1
