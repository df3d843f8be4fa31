"""The dashboard's filters, shared by the page and the CSV export (the account forms are in ``accounts/forms.py``)."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from datetime import timezone as dt_timezone

from django import forms
from django.contrib.auth import get_user_model
from django.db.models import QuerySet
from django.utils import timezone

from keys.models import KEY_NAMESPACE, APIKey, UsageRecord
from keys.stats import Window, records

DEFAULT_DAYS = 30
MAX_DAYS = 366


class DateInput(forms.DateInput):
    input_type = "date"


class UsageFilterForm(forms.Form):
    """GET filters: a date range (UTC days, both inclusive), a user, a key, a model and an endpoint.

    Without dates the window is the last 30 days up to now.  An unknown user or key prefix is a
    form error, never an empty result that looks like "no usage".
    """

    start = forms.DateField(required=False, widget=DateInput, label="From")
    end = forms.DateField(required=False, widget=DateInput, label="To")
    user = forms.CharField(required=False, max_length=150, label="User", help_text="username")
    key = forms.CharField(required=False, max_length=64, label="Key", help_text="prefix, e.g. sk-cs-AbCd1234")
    model = forms.CharField(
        required=False,
        max_length=200,
        label="Model",
        widget=forms.TextInput(attrs={"list": "model-names"}),  # the served models and those in the records
    )
    endpoint = forms.ChoiceField(
        required=False,
        label="Endpoint",
        choices=[("", "all"), ("/v1/completions", "/v1/completions"), ("/v1/chat/completions", "/v1/chat/completions")],
    )

    def clean_user(self):
        username = self.cleaned_data["user"].strip()
        if not username:
            return None
        try:
            return get_user_model()._default_manager.get_by_natural_key(username)
        except get_user_model().DoesNotExist:
            raise forms.ValidationError(f"No user named “{username}”.") from None

    def clean_key(self):
        prefix = self.cleaned_data["key"].strip().removeprefix(KEY_NAMESPACE).rstrip("….").split(".")[0]
        if not prefix:
            return None
        api_key = APIKey.objects.filter(prefix=prefix).first()
        if api_key is None:
            raise forms.ValidationError(f"No key with prefix “{prefix}”.")
        return api_key

    def clean_model(self):
        return self.cleaned_data["model"].strip() or None

    def clean(self):
        cleaned = super().clean()
        start, end = cleaned.get("start"), cleaned.get("end")
        if start and end:
            if end < start:
                raise forms.ValidationError("“To” is before “From”.")
            if (end - start).days >= MAX_DAYS:
                raise forms.ValidationError(f"Choose at most {MAX_DAYS} days.")
        return cleaned

    def window(self) -> Window:
        """``[start 00:00, end+1 00:00)`` in UTC, the end capped at now; defaults to the last 30 days."""
        data = self.cleaned_data if self.is_bound and self.is_valid() else {}
        now = timezone.now()
        end_day = data.get("end") or now.date()
        start_day = data.get("start") or end_day - timedelta(days=DEFAULT_DAYS - 1)
        start = datetime.combine(start_day, time.min, tzinfo=dt_timezone.utc)
        end = datetime.combine(end_day + timedelta(days=1), time.min, tzinfo=dt_timezone.utc)
        return Window(start, min(end, now + timedelta(seconds=1)))

    def records(self, window: Window | None = None) -> QuerySet[UsageRecord]:
        """The records the filters select in ``window`` (default: the form's own).

        An invalid form selects all of the default window, unfiltered.
        """
        data = self.cleaned_data if self.is_bound and self.is_valid() else {}
        user, api_key = data.get("user"), data.get("key")
        return records(
            window or self.window(),
            owner_id=user.pk if user else None,
            api_key_id=api_key.pk if api_key else None,
            model=data.get("model"),
            endpoint=data.get("endpoint") or None,
        )
