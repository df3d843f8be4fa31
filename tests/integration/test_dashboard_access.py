"""The staff dashboard and its CSV export: staff only, the same filters, and CSRF on every form."""

from __future__ import annotations

import csv
import io
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from tests.usage_helpers import add_usage

pytestmark = [pytest.mark.django_db, pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume")]

DASHBOARD = "/admin/dashboard/"
EXPORT = "/admin/dashboard/export.csv"
STAFF_ONLY = (DASHBOARD, EXPORT, "/admin/dashboard/accounts/")


@pytest.fixture
def staff(client, staff_user):
    client.force_login(staff_user)
    return client


def export_rows(response) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(b"".join(response).decode())))


@pytest.mark.parametrize("url", STAFF_ONLY)
def test_anonymous_visitors_are_sent_to_the_admin_login(client, url):
    response = client.get(url)

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


@pytest.mark.parametrize("url", STAFF_ONLY)
def test_users_without_staff_status_are_sent_to_the_admin_login(client, user, valid_key, url):
    add_usage(valid_key.api_key, timezone.now())
    client.force_login(user)

    response = client.get(url)

    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_admin_index_links_to_the_dashboard(staff):
    assert f'href="{DASHBOARD}"' in staff.get("/admin/").content.decode()


def test_the_dashboard_shows_totals_tables_and_chart_data(staff, valid_key, other_users_key):
    now = timezone.now()
    add_usage(valid_key.api_key, now, prompt_tokens=100, completion_tokens=20)
    add_usage(other_users_key.api_key, now - timedelta(days=3), prompt_tokens=7, completion_tokens=3)
    add_usage(other_users_key.api_key, now, status_code=429, prompt_tokens=0, completion_tokens=0)

    response = staff.get(DASHBOARD)

    assert response.status_code == 200
    context = response.context
    assert context["summary"]["requests"] == 3 and context["summary"]["tokens"] == 130
    assert context["summary"]["rate_limited"] == 1
    assert sum(context["hourly"]["tokens"]) == 120  # the last 24 hours
    assert sum(context["daily"]["tokens"]) == 130 and len(context["daily"]["labels"]) == 30
    assert [row["username"] for row in context["top_users"]] == ["alice", "bob"]
    page = response.content.decode()
    for element in ('id="chart-hourly"', 'id="chart-daily"', 'id="hourly-data"', 'id="live"', "chart.umd.js"):
        assert element in page


def test_the_dashboard_filters_by_user_key_and_model(staff, valid_key, other_users_key):
    add_usage(valid_key.api_key, timezone.now(), prompt_tokens=100, completion_tokens=0)
    add_usage(other_users_key.api_key, timezone.now(), prompt_tokens=5, completion_tokens=0, model="other")

    assert staff.get(DASHBOARD, {"user": "bob"}).context["summary"]["tokens"] == 5
    assert staff.get(DASHBOARD, {"key": f"sk-cs-{valid_key.api_key.prefix}"}).context["summary"]["tokens"] == 100
    assert staff.get(DASHBOARD, {"model": "other"}).context["summary"]["tokens"] == 5
    unknown = staff.get(DASHBOARD, {"user": "nobody"})
    assert unknown.status_code == 200 and "No user named" in unknown.content.decode()


def test_the_model_filter_suggests_the_served_models_then_those_usage_was_recorded_under(staff, valid_key, monkeypatch):
    from inference import process
    from inference.registry import ModelRegistry, ServedModel
    from keys.models import DailyUsage

    class Engine:
        def __init__(self, model_id: str) -> None:
            self.model_id = model_id

    monkeypatch.setattr(process, "_models", ModelRegistry([ServedModel(Engine("small")), ServedModel(Engine("big"))]))
    DailyUsage.objects.add(add_usage(valid_key.api_key, timezone.now(), model="retired"))
    DailyUsage.objects.add(add_usage(valid_key.api_key, timezone.now(), model="big"))

    page = staff.get(DASHBOARD).content.decode()

    assert 'list="model-names"' in page
    assert re.findall(
        r'<option value="([^"]+)">', page.split('<datalist id="model-names">')[1].split("</datalist>")[0]
    ) == [
        "small",
        "big",
        "retired",
    ]
    assert 'id="live-models"' in page  # each model's live figures (filled by live.js)


def test_the_export_is_the_filtered_records_as_csv(staff, valid_key, other_users_key):
    add_usage(valid_key.api_key, timezone.now(), prompt_tokens=100, completion_tokens=20, user="=HYPERLINK(1)")
    add_usage(other_users_key.api_key, timezone.now(), prompt_tokens=5, completion_tokens=0)
    add_usage(valid_key.api_key, timezone.now() - timedelta(days=40))  # outside the default 30 days

    response = staff.get(EXPORT, {"user": "alice"})

    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert re.match(
        r'attachment; filename="usage-\d{4}-\d\d-\d\d-\d{4}-\d\d-\d\d\.csv"', response["Content-Disposition"]
    )
    rows = export_rows(response)
    assert [(row["username"], row["api_key_prefix"], row["total_tokens"]) for row in rows] == [
        ("alice", valid_key.api_key.prefix, "120")
    ]
    assert rows[0]["user"] == "'=HYPERLINK(1)"  # never a formula in a spreadsheet


def test_the_export_link_carries_the_dashboards_filters(staff):
    page = staff.get(DASHBOARD, {"user": "", "model": "m1"}).content.decode()

    assert 'href="/admin/dashboard/export.csv?start=&amp;end=&amp;user=&amp;key=&amp;model=m1"' in page or (
        "/admin/dashboard/export.csv?" in page and "model=m1" in page
    )


def test_an_export_with_invalid_filters_is_a_400(staff):
    assert staff.get(EXPORT, {"start": "2026-03-10", "end": "2026-03-01"}).status_code == 400


# --- CSRF ---------------------------------------------------------------------------------------


POST_FORM = re.compile(r"<form\b[^>]*method=\"post\"[^>]*>(.*?)</form>", re.S | re.I)


def test_every_post_form_on_the_account_pages_carries_a_csrf_token(client, user, valid_key):
    client.force_login(user)
    pages = [
        client.get("/account/"),
        client.get(f"/account/keys/{valid_key.api_key.pk}/revoke/"),
        client.post("/account/keys/create/", {"name": "x"}),
    ]
    anonymous = Client()
    pages.append(anonymous.get("/account/login/"))

    for page in pages:
        forms = POST_FORM.findall(page.content.decode())
        assert forms, page.request["PATH_INFO"]
        for form in forms:
            assert 'name="csrfmiddlewaretoken"' in form


@pytest.mark.parametrize(
    "path",
    ["/account/keys/create/", "/account/keys/{pk}/revoke/", "/account/logout/"],
)
def test_account_posts_without_a_csrf_token_are_refused(user, valid_key, path):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post(path.format(pk=valid_key.api_key.pk), {"name": "x"})

    assert response.status_code == 403
    valid_key.api_key.refresh_from_db()
    assert not valid_key.api_key.is_revoked
    assert valid_key.api_key.owner.api_keys.count() == 1


def test_login_and_signup_posts_without_a_csrf_token_are_refused(user):
    from dashboard.models import AccountSettings

    settings = AccountSettings.current()
    settings.self_signup = True
    settings.save()
    client = Client(enforce_csrf_checks=True)

    assert client.post("/account/login/", {"username": "alice", "password": "alice-password-1"}).status_code == 403
    assert client.post("/account/signup/", {"username": "x"}).status_code == 403


def test_staff_posts_for_a_user_without_a_csrf_token_are_refused(staff_user, user, valid_key):
    client = Client(enforce_csrf_checks=True)
    client.force_login(staff_user)
    base = f"/admin/dashboard/accounts/{user.pk}/"

    assert client.post(base + "keys/create/", {"name": "x"}).status_code == 403
    assert client.post(f"{base}keys/{valid_key.api_key.pk}/revoke/").status_code == 403
    valid_key.api_key.refresh_from_db()
    assert not valid_key.api_key.is_revoked
