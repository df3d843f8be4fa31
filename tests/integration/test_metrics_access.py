"""``GET /metrics``: the loopback and METRICS_ALLOWED_IPS read it, so does a bearer METRICS_TOKEN; others get 404."""

from __future__ import annotations

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-0123456789"


@pytest.fixture(autouse=True)
def metrics_settings(settings):
    from inference.metrics import EngineMetrics

    EngineMetrics("tiny")  # an engine's samples, labelled with its model_name, as a serving process has them
    settings.METRICS_ALLOWED_IPS = ["127.0.0.1", "::1", "10.0.0.0/8"]
    settings.METRICS_TOKEN = TOKEN


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.20.30.40"])
def test_an_allowed_address_reads_the_metrics_in_prometheus_text_format(address):
    response = Client(REMOTE_ADDR=address).get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    text = response.content.decode()
    for name in (
        "completions_num_requests_running",
        "completions_generation_tokens_total",
        "completions_prefix_cache_hits_total",
        "completions_time_to_first_token_seconds_bucket",
        "completions_http_requests_total",
        "completions_rate_limited_total",
        "completions_usage_record_write_failures_total",
    ):
        assert name in text


@pytest.mark.parametrize("address", ["192.0.2.7", "11.0.0.1", "2001:db8::1"])
def test_any_other_address_gets_a_404(address):
    assert Client(REMOTE_ADDR=address).get("/metrics").status_code == 404


def test_the_bearer_token_opens_it_from_anywhere():
    response = Client(REMOTE_ADDR="192.0.2.7").get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})

    assert response.status_code == 200


@pytest.mark.parametrize(
    "authorization",
    [f"Bearer {TOKEN}x", f"Basic {TOKEN}", "Bearer ", "Bearer", TOKEN, f"Bearer {TOKEN[:-1]}"],
)
def test_a_wrong_or_malformed_token_gets_a_404(authorization):
    response = Client(REMOTE_ADDR="192.0.2.7").get("/metrics", headers={"Authorization": authorization})

    assert response.status_code == 404


def test_without_a_token_set_no_bearer_opens_it(settings):
    settings.METRICS_TOKEN = ""

    response = Client(REMOTE_ADDR="192.0.2.7").get("/metrics", headers={"Authorization": "Bearer "})

    assert response.status_code == 404


def test_the_default_allows_only_the_loopback(settings):
    from completions_site import settings as defaults

    settings.METRICS_ALLOWED_IPS = defaults.METRICS_ALLOWED_IPS  # the environment's, "127.0.0.1,::1" unless set
    assert Client(REMOTE_ADDR="127.0.0.1").get("/metrics").status_code == 200
    assert Client(REMOTE_ADDR="10.0.0.1").get("/metrics").status_code == 404


def test_a_bad_metrics_allowed_ips_entry_is_a_system_check_error(settings):
    from completions_site.checks import check_metrics_settings

    settings.METRICS_ALLOWED_IPS = ["127.0.0.1", "10.0.0.0/8", "not-an-address"]

    assert [error.id for error in check_metrics_settings(None)] == ["completions_site.E006"]


@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_another_method_is_a_plain_405_not_the_csrf_page(method):
    response = getattr(Client(REMOTE_ADDR="127.0.0.1", enforce_csrf_checks=True), method)("/metrics")

    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert response.content == b""


def test_another_method_from_a_client_not_allowed_is_still_a_404():
    response = Client(REMOTE_ADDR="192.0.2.7", enforce_csrf_checks=True).post("/metrics")

    assert response.status_code == 404
    assert b"CSRF" not in response.content
