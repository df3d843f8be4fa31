"""The account forms: a new key, and self sign-up."""

from __future__ import annotations

from datetime import datetime, time
from datetime import timezone as dt_timezone

from django import forms
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import UserCreationForm
from django.utils import timezone


class DateInput(forms.DateInput):
    input_type = "date"


class CreateKeyForm(forms.Form):
    """A new key for the account's owner: a name and an optional expiry day."""

    name = forms.CharField(max_length=100, help_text="What the key is for, e.g. “laptop” or “CI”.")
    expires_on = forms.DateField(
        required=False,
        widget=DateInput,
        label="Expires on",
        help_text="Optional; the key stops working at 00:00 UTC that day.",
    )

    def clean_expires_on(self):
        day = self.cleaned_data["expires_on"]
        if day is not None and day <= timezone.now().date():
            raise forms.ValidationError("Choose a day after today.")
        return day

    def expires_at(self) -> datetime | None:
        day = self.cleaned_data.get("expires_on")
        return None if day is None else datetime.combine(day, time.min, tzinfo=dt_timezone.utc)


class SignupForm(UserCreationForm):
    """Self sign-up (only while staff allow it): a username, an optional email and a password."""

    class Meta(UserCreationForm.Meta):
        model = get_user_model()
        fields = ("username", "email")
