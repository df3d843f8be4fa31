"""Admin for API keys (create, inspect, revoke, set limits) and read-only views of usage.

A key's plaintext exists once: when the add form is saved, it appears in the success message
and nowhere else.  The hash is never shown, and no form can change a key's prefix, hash or
revocation.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import admin as auth_admin
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest
from django.utils.html import format_html

from .errors import TooManyKeys
from .models import APIKey, DailyUsage, ModelPrice, UsageRecord, UserLimits, check_key_cap
from .pricing import to_money


class StatusFilter(admin.SimpleListFilter):
    """Filter keys by ``APIKey.status``: active, revoked or expired."""

    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("active", "Active"), ("revoked", "Revoked"), ("expired", "Expired")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> QuerySet[APIKey]:
        by_status = {"active": queryset.active, "revoked": queryset.revoked, "expired": queryset.expired}
        chosen = by_status.get(self.value())
        return chosen() if chosen else queryset


class APIKeyForm(ModelForm):
    """The key's form; a new key beyond its owner's cap of active keys is an error on the form."""

    def clean_model_limits(self) -> dict:
        """An empty box is no limits per model (``{}``), not JSON's ``null``."""
        return self.cleaned_data.get("model_limits") or {}

    def clean(self) -> dict:
        cleaned = super().clean() or {}
        owner = cleaned.get("owner")
        if self.instance._state.adding and owner is not None:
            try:
                check_key_cap(owner.pk)
            except TooManyKeys as error:
                raise ValidationError(str(error)) from None
        return cleaned


@admin.register(APIKey)
class APIKeyAdmin(admin.ModelAdmin):
    """Keys: the add form asks name, owner, expiry, limits and models; the secret is generated.

    Limits and models stay editable; a change applies to the key's next request on every process
    (keys are read from the database on each request).
    """

    list_display = ("name", "owner", "prefix", "created_at", "last_used_at", "expires_at", "status", "limits")
    list_select_related = ("owner",)
    list_filter = (StatusFilter, ("owner", admin.RelatedOnlyFieldListFilter))
    search_fields = ("name", "prefix")
    search_help_text = "Search by name or prefix (the 8 characters after “sk-cs-”)."
    actions = ("revoke_selected",)
    form = APIKeyForm
    limit_fields = (
        "rpm_limit",
        "tpm_limit",
        "max_concurrent",
        "monthly_token_quota",
        "budget",
        "budget_period",
        "allowed_models",
        "model_limits",
    )
    add_fields = ("name", "owner", "expires_at", *limit_fields)
    change_fields = (
        "name",
        "owner",
        "prefix",
        "status",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        *limit_fields,
    )
    # A key stays with the user it was issued to; prefix, timestamps and revocation are facts.
    change_readonly_fields = ("owner", "prefix", "status", "created_at", "last_used_at", "revoked_at")

    def get_fields(self, request: HttpRequest, obj: APIKey | None = None) -> tuple[str, ...]:
        return self.add_fields if obj is None else self.change_fields

    def get_readonly_fields(self, request: HttpRequest, obj: APIKey | None = None) -> tuple[str, ...]:
        return () if obj is None else self.change_readonly_fields

    def get_changeform_initial_data(self, request: HttpRequest) -> dict:
        return {"owner": request.user.pk, **super().get_changeform_initial_data(request)}

    @admin.display(description="status")
    def status(self, obj: APIKey) -> str:
        return obj.status

    @admin.display(description="limits")
    def limits(self, obj: APIKey) -> str:
        """The key's own limits, e.g. “rpm 10; models: a, b; b: rpm 5”; “defaults” when it has none."""
        own = [
            (label, value)
            for label, value in (
                ("rpm", obj.rpm_limit),
                ("tpm", obj.tpm_limit),
                ("concurrent", obj.max_concurrent),
                ("tokens/month", obj.monthly_token_quota),
                ("budget", obj.budget),
            )
            if value is not None
        ]
        parts = [f"{label} {value or 'unlimited'}" for label, value in own]
        if obj.models:
            parts.append("models: " + ", ".join(obj.models))
        for model, *per_minute in obj.own_model_limits():
            numbers = zip(("rpm", "tpm"), per_minute)
            parts.append(f"{model}: " + ", ".join(f"{label} {n}" for label, n in numbers if n))
        return "; ".join(parts) or "defaults"

    def save_model(self, request: HttpRequest, obj: APIKey, form: ModelForm, change: bool) -> None:
        """Generate and show the key once on add; a change saves only the editable fields."""
        if change:
            super().save_model(request, obj, form, change)
            return
        plaintext = APIKey.objects.issue(obj)
        messages.success(
            request,
            format_html(
                "The new API key for “{}” is <code>{}</code> — copy it now: it is not stored and "
                "will not be shown again.",
                obj.name,
                plaintext,
            ),
        )

    @admin.action(description="Revoke selected keys", permissions=["change"])
    def revoke_selected(self, request: HttpRequest, queryset: QuerySet[APIKey]) -> None:
        """Revoke every selected key that is not revoked yet, logging each in the admin history."""
        revoked = [api_key for api_key in queryset if api_key.revoke()]
        for api_key in revoked:
            self.log_change(request, api_key, "Revoked.")
        self.message_user(request, f"Revoked {len(revoked)} of {queryset.count()} selected keys.", messages.SUCCESS)


class ReadOnlyModelAdmin(admin.ModelAdmin):
    """An admin that shows rows and never adds, changes or deletes them (derived or audit data)."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ReadOnlyModelAdmin):
    """Usage records are an audit trail: viewable, never added, changed or deleted here."""

    list_display = (
        "created_at",
        "request_id",
        "api_key",
        "owner",
        "model",
        "endpoint",
        "stream",
        "status_code",
        "finish_reason",
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "cost",
        "latency_ms",
    )
    list_select_related = ("api_key", "owner")
    list_filter = ("api_key", "model", "status_code", "stream", "created_at")
    date_hierarchy = "created_at"
    search_fields = ("request_id", "user")

    @admin.display(description="cost", ordering="cost_nanos")
    def cost(self, obj: UsageRecord) -> str:
        return str(to_money(obj.cost_nanos))


@admin.register(DailyUsage)
class DailyUsageAdmin(ReadOnlyModelAdmin):
    """The daily rollup, read-only: it is derived from the usage records."""

    list_display = (
        "day",
        "api_key",
        "model",
        "requests",
        "errors",
        "rate_limited",
        "prompt_tokens",
        "completion_tokens",
        "cost",
        "average_latency_ms",
    )
    list_select_related = ("api_key",)
    list_filter = ("api_key", "model", "day")
    date_hierarchy = "day"

    @admin.display(description="average latency (ms)")
    def average_latency_ms(self, obj: DailyUsage) -> int:
        return round(obj.latency_ms_sum / obj.requests) if obj.requests else 0

    @admin.display(description="cost", ordering="cost_nanos")
    def cost(self, obj: DailyUsage) -> str:
        return str(to_money(obj.cost_nanos))


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    """Prices per million tokens: a change applies to requests admitted after it (records keep their cost)."""

    list_display = ("model", "prompt_per_million", "completion_per_million", "updated_at")
    search_fields = ("model",)


class UserLimitsInline(admin.StackedInline):
    """A user's own limits across all their keys, and their cap of active keys, on the user's page."""

    model = UserLimits
    can_delete = False
    verbose_name_plural = "limits across all of the user's API keys (empty fields: the site's defaults)"


User = get_user_model()
admin.site.unregister(User)


@admin.register(User)
class UserAdmin(auth_admin.UserAdmin):
    """Django's user admin, with the user's limits inline."""

    inlines = (*auth_admin.UserAdmin.inlines, UserLimitsInline)

    def get_inline_instances(self, request: HttpRequest, obj=None) -> list:
        """The limits on an existing user's page only: the add form stays Django's two steps."""
        return super().get_inline_instances(request, obj) if obj is not None else []
