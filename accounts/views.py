"""Self-service accounts under ``/account/``: a user's own keys and usage, and nobody else's.

The same views serve staff acting for a user under ``/admin/dashboard/accounts/<user_id>/``
(mounted there behind ``admin.site.admin_view``); :func:`account_for` decides whose account a
request may see, and every key lookup is filtered by that owner, so another user's key is a 404.

A new key's plaintext is rendered once, in the response to the POST that created it (never
cached, never stored, not even in the session); reloading the page does not show it again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.models import ADDITION, CHANGE, LogEntry
from django.contrib.auth import get_user_model, login
from django.contrib.auth import views as auth_views
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.models import AccountSettings
from keys import periods, stats
from keys.errors import TooManyKeys
from keys.limits import Limits
from keys.models import APIKey

from .forms import CreateKeyForm, SignupForm

USAGE_DAYS = 30
# The per-key limits shown: (label, keys.models.APIKey field, keys.limits.Limits attribute).  A
# key's empty limit means the default; 0 means no limit.
LIMITS = (
    ("Requests/min", "rpm_limit", "rpm"),
    ("Tokens/min", "tpm_limit", "tpm"),
    ("Concurrent", "max_concurrent", "max_concurrent"),
    ("Tokens/month", "monthly_token_quota", "monthly_tokens"),
)


@dataclass(frozen=True)
class Account:
    """Whose account a page shows, and whether staff are acting for that user from the admin."""

    owner: AbstractBaseUser
    acting_staff: bool

    def url(self, name: str, *args: Any) -> str:
        """The URL of page ``name`` (``overview``, ``create-key``, ``revoke-key``) of this account."""
        if self.acting_staff:
            return reverse(f"dashboard:account-{name}", args=[self.owner.pk, *args])
        return reverse(f"account:{name}", args=args)


def account_for(request: HttpRequest, user_id: int | None, permission: str) -> Account:
    """The request's own account, or (staff with ``permission`` only) the account of ``user_id``."""
    if user_id is None:
        return Account(request.user, acting_staff=False)
    if not (request.user.is_active and request.user.is_staff and request.user.has_perm(permission)):
        raise PermissionDenied
    return Account(get_object_or_404(get_user_model()._default_manager, pk=user_id), acting_staff=True)


@never_cache
def overview(request: HttpRequest, user_id: int | None = None) -> HttpResponse:
    """The account page: keys with prefix, last use, limits and month-to-date usage; a usage chart."""
    account = account_for(request, user_id, "keys.view_apikey")
    return _render_overview(request, account, CreateKeyForm())


@never_cache
@require_POST
def create_key(request: HttpRequest, user_id: int | None = None) -> HttpResponse:
    """Create a key and answer with the account page showing its plaintext, this once."""
    account = account_for(request, user_id, "keys.add_apikey")
    form = CreateKeyForm(request.POST)
    if not form.is_valid():
        return _render_overview(request, account, form, status=400)
    try:
        api_key, plaintext = APIKey.objects.create_key(
            name=form.cleaned_data["name"], owner=account.owner, expires_at=form.expires_at()
        )
    except TooManyKeys as error:
        form.add_error(None, str(error))
        return _render_overview(request, account, form, status=400)
    _log(request, api_key, ADDITION, "Created from the account page" + _for(account))
    return _render_overview(request, account, CreateKeyForm(), new_key=(api_key, plaintext), status=201)


@never_cache
@require_http_methods(["GET", "POST"])
def revoke_key(request: HttpRequest, pk: int, user_id: int | None = None) -> HttpResponse:
    """GET: ask to confirm (works without JavaScript); POST: revoke, one-way, and go back."""
    account = account_for(request, user_id, "keys.change_apikey")
    api_key = get_object_or_404(APIKey, pk=pk, owner=account.owner)
    if request.method == "GET":
        context = {"account": account, "api_key": api_key, "back_url": account.url("overview")}
        return render(request, "account/revoke_confirm.html", context)
    if api_key.revoke():
        _log(request, api_key, CHANGE, "Revoked from the account page" + _for(account))
        messages.success(request, f"Revoked “{api_key.name}” (sk-cs-{api_key.prefix}…). It no longer works.")
    else:
        messages.info(request, f"“{api_key.name}” was already revoked.")
    return HttpResponseRedirect(account.url("overview"))


class LoginView(auth_views.LoginView):
    """Django's login, on our template, offering sign-up only while it is open."""

    template_name = "account/login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs: Any) -> dict[str, Any]:
        return {**super().get_context_data(**kwargs), "signup_open": AccountSettings.current().self_signup}


@never_cache
@require_http_methods(["GET", "POST"])
def signup(request: HttpRequest) -> HttpResponse:
    """Self sign-up, only while staff have turned it on (admin → Account settings); a 404 otherwise."""
    if not AccountSettings.current().self_signup:
        raise Http404("Sign-up is closed.")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        user = form.save()
        login(request, user, backend="django.contrib.auth.backends.ModelBackend")
        messages.success(request, "Welcome! Create your first API key below.")
        return HttpResponseRedirect(reverse("account:overview"))
    return render(request, "account/signup.html", {"form": form}, status=400 if form.errors else 200)


def _render_overview(
    request: HttpRequest,
    account: Account,
    form: CreateKeyForm,
    *,
    new_key: tuple[APIKey, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    owner = account.owner
    now = timezone.now()
    month = stats.month_to_date_by_key(owner.pk, now)
    keys = [
        {
            "key": api_key,
            "limits": key_limits(api_key),
            "month": month.get(api_key.pk, {}),
            "quota": monthly_quota(api_key),
            "revoke_url": account.url("revoke-key", api_key.pk),
        }
        for api_key in APIKey.objects.filter(owner=owner).order_by("revoked_at", "-created_at")
    ]
    start = periods.floor_day(now) - timedelta(days=USAGE_DAYS - 1)
    mine = stats.records(stats.Window(start, now + timedelta(seconds=1)), owner_id=owner.pk)
    this_month = stats.Window(periods.month_start(now), now + timedelta(seconds=1))
    context = {
        "account": account,
        "owner": owner,
        "keys": keys,
        "form": form,
        "create_url": account.url("create-key"),
        "new_key": new_key,
        "month_total": stats.summary(stats.records(this_month, owner_id=owner.pk)),
        "usage": stats.chart_data(stats.time_series(mine, "day", start, USAGE_DAYS), "day"),
        "usage_days": USAGE_DAYS,
    }
    return render(request, "account/overview.html", context, status=status)


def key_limits(api_key: APIKey) -> list[dict[str, Any]]:
    """The key's limits as ``{"label", "value", "default"}``, ``value`` already in words, then its
    own per-minute limits for each model (``For big``: ``60 requests/min, 100,000 tokens/min``).

    ``default`` says the key has no limit of its own and the site's default applies.
    """
    in_force = Limits.of(api_key)
    found = []
    for label, field, attribute in LIMITS:
        value = getattr(in_force, attribute)
        default = getattr(api_key, field) is None
        found.append({"label": label, "value": "no limit" if value == 0 else f"{value:,}", "default": default})
    found.append({"label": "Models", "value": ", ".join(api_key.models) or "all", "default": False})
    for model, *own in api_key.own_model_limits():
        words = [f"{n:,} {unit}/min" for n, unit in zip(own, ("requests", "tokens")) if n]
        found.append({"label": f"For {model}", "value": ", ".join(words), "default": False})
    return found


def monthly_quota(api_key: APIKey) -> int | None:
    """The key's tokens per month in force (its own or the default), ``None`` without a limit."""
    return Limits.of(api_key).monthly_tokens or None


def _for(account: Account) -> str:
    return f" by staff for {account.owner.get_username()}." if account.acting_staff else "."


def _log(request: HttpRequest, api_key: APIKey, flag: int, message: str) -> None:
    """Record the action in the admin's history of the key, as the admin's own actions are."""
    LogEntry.objects.log_actions(request.user.pk, [api_key], flag, message, single_object=True)
