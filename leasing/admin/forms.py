"""Forms of the admin pages: the operator-action confirmation and the dashboard controls.

Malformed input never reaches a service: a form error is shown and no row
changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django import forms
from django.utils.dateparse import parse_datetime

from ..console.windows import THROUGHPUT_WINDOWS
from ..states import PauseKind, WorkItemStatus

if TYPE_CHECKING:
    from .display import ClockedWorkItem

BIGINT_MAX = 2**63 - 1


def reason_field() -> forms.CharField:
    """The reason an operator gives for an action (recorded with it)."""
    return forms.CharField(
        label="Reason",
        max_length=1000,
        strip=True,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 70}),
        help_text=(
            "Required. Recorded with your user name in each item's state_transition "
            "checkpoint and in the admin log."
        ),
        error_messages={"required": "Give a reason: it is recorded with the action."},
    )


# Hex digits of a selection's fingerprint (`leasing.admin.bulk.Selection.fingerprint`).
FINGERPRINT_DIGITS = 16


class BulkActionForm(forms.Form):
    """Confirm an action on every item matching a selection: a reason, and the selection
    seen (how many items: `expected`; which ones: `fingerprint`)."""

    reason = reason_field()
    expected = forms.IntegerField(min_value=0, max_value=BIGINT_MAX, widget=forms.HiddenInput)
    fingerprint = forms.RegexField(
        regex=rf"\A[0-9a-f]{{{FINGERPRINT_DIGITS}}}\Z", strip=False, widget=forms.HiddenInput
    )


class OperatorActionForm(forms.Form):
    """Confirm an operator action (force-release, force-fail, retry, cancel, delete, run
    now) for the selected work items.

    Besides the reason, the form carries three hidden fields per item: the
    `status`, `lease_token` and `heartbeat_at` the item had when the
    confirmation page was rendered. The action is applied only if they are still
    the same: a new claim changes the token, which means the lease is not the
    one the operator looked at; every renewal moves the heartbeat, which the
    actions that take the lease away (force-release, force-fail) also require
    unchanged (a cancel only asks the run to stop); a status that
    changed (a failed item retried by someone else, now pending) means the item
    is not the one they chose, even where the action accepts its new status.
    """

    TOKEN_PREFIX = "token-"
    HEARTBEAT_PREFIX = "heartbeat-"
    STATUS_PREFIX = "status-"

    reason = reason_field()

    def __init__(self, *args: Any, items: Iterable[ClockedWorkItem], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.items = list(items)
        for item in self.items:
            self.fields[self.token_field_name(item.pk)] = forms.IntegerField(
                min_value=0,
                max_value=BIGINT_MAX,
                initial=item.lease_token,
                widget=forms.HiddenInput,
                error_messages={
                    "required": f"The lease token of {item.pk} is missing.",
                    "invalid": f"The lease token of {item.pk} is not a number.",
                },
            )
            self.fields[self.heartbeat_field_name(item.pk)] = forms.CharField(
                required=False,
                initial=_iso(item.heartbeat_at),
                widget=forms.HiddenInput,
            )
            self.fields[self.status_field_name(item.pk)] = forms.ChoiceField(
                choices=WorkItemStatus.choices,
                initial=item.status,
                widget=forms.HiddenInput,
                error_messages={
                    "required": f"The status of {item.pk} is missing.",
                    "invalid_choice": f"The status of {item.pk} is not a work item status.",
                },
            )

    @classmethod
    def token_field_name(cls, pk: str) -> str:
        return f"{cls.TOKEN_PREFIX}{pk}"

    @classmethod
    def heartbeat_field_name(cls, pk: str) -> str:
        return f"{cls.HEARTBEAT_PREFIX}{pk}"

    @classmethod
    def status_field_name(cls, pk: str) -> str:
        return f"{cls.STATUS_PREFIX}{pk}"

    def clean(self) -> dict[str, Any]:
        super().clean()
        cleaned = self.cleaned_data
        for item in self.items:
            name = self.heartbeat_field_name(item.pk)
            if name not in self.data:
                self.add_error(name, f"The last heartbeat of {item.pk} is missing.")
                continue
            raw = cleaned.get(name) or ""
            if raw and _parse(raw) is None:
                self.add_error(name, f"The last heartbeat of {item.pk} is not a date and time.")
        return cleaned

    def hidden_fields_for_items(self) -> list[forms.BoundField]:
        fields = []
        for item in self.items:
            fields.append(self[self.token_field_name(item.pk)])
            fields.append(self[self.heartbeat_field_name(item.pk)])
            fields.append(self[self.status_field_name(item.pk)])
        return fields

    @property
    def has_token_errors(self) -> bool:
        """True when a hidden field was missing or altered (not the user's typing)."""
        hidden = (self.TOKEN_PREFIX, self.HEARTBEAT_PREFIX, self.STATUS_PREFIX)
        return any(name.startswith(hidden) for name in self.errors)

    def expected_leases(self) -> dict[str, tuple[int, datetime | None]]:
        """`{work_item_id: (token, heartbeat_at)}` as confirmed (after `is_valid()`)."""
        result = {}
        for item in self.items:
            raw = self.cleaned_data.get(self.heartbeat_field_name(item.pk)) or ""
            result[item.pk] = (
                self.cleaned_data[self.token_field_name(item.pk)],
                _parse(raw) if raw else None,
            )
        return result

    def expected_statuses(self) -> dict[str, str]:
        """`{work_item_id: status}` as confirmed (after `is_valid()`)."""
        return {item.pk: self.cleaned_data[self.status_field_name(item.pk)] for item in self.items}


def _parse(raw: str) -> datetime | None:
    """An ISO date and time; None when malformed or out of range (`2024-13-45T00:00`)."""
    try:
        return parse_datetime(raw)
    except ValueError:
        return None


def _iso(value: datetime | None) -> str:
    return "" if value is None else value.isoformat()


def _window_label(minutes: int) -> str:
    return f"{minutes // 60} h" if minutes >= 60 else f"{minutes} min"


class WindowForm(forms.Form):
    """The window of the top errors and history pages: 1 h, 24 h or 7 d."""

    WINDOWS = {60: "1 h", 1440: "24 h", 10080: "7 d"}
    DEFAULT_WINDOW = 1440

    window = forms.TypedChoiceField(
        label="Last",
        choices=list(WINDOWS.items()),
        coerce=int,
        required=False,
        # django-stubs types empty_value as str | None; Django takes any value.
        empty_value=DEFAULT_WINDOW,  # type: ignore[arg-type]
        initial=DEFAULT_WINDOW,
    )

    def minutes(self) -> int:
        """The window chosen; the default when it is missing or not one of the choices
        (whatever else of the form is wrong)."""
        if not self.is_bound or (not self.is_valid() and "window" in self.errors):
            return self.DEFAULT_WINDOW
        window: int = self.cleaned_data.get("window") or self.DEFAULT_WINDOW
        return window


class HistoryForm(WindowForm):
    """The history page's window, narrowed to one queue and/or one work type."""

    queue = forms.ChoiceField(label="Queue", required=False)
    work_type = forms.ChoiceField(label="Work type", required=False)

    def __init__(
        self, *args: Any, queues: Iterable[str], work_types: Iterable[str], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        for name, everything, names in (
            ("queue", "every queue", queues),
            ("work_type", "every work type", work_types),
        ):
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = [("", everything), *((n, n) for n in names)]

    def narrowed_to(self) -> tuple[str | None, str | None]:
        """(queue, work type) chosen, each None for all or when it is not a known one."""
        if not self.is_bound:
            return None, None
        self.is_valid()
        return (
            None if "queue" in self.errors else self.cleaned_data.get("queue") or None,
            None if "work_type" in self.errors else self.cleaned_data.get("work_type") or None,
        )


class DashboardForm(forms.Form):
    """The dashboard's query-string controls: throughput window and refresh period."""

    DEFAULT_WINDOW = 60
    DEFAULT_REFRESH = 5
    WINDOWS = {m: _window_label(m) for m in THROUGHPUT_WINDOWS}

    window = forms.TypedChoiceField(
        label="Throughput window",
        choices=list(WINDOWS.items()),
        coerce=int,
        required=False,
        # django-stubs types empty_value as str | None; Django takes any value.
        empty_value=DEFAULT_WINDOW,  # type: ignore[arg-type]
        initial=DEFAULT_WINDOW,
    )
    refresh = forms.IntegerField(
        label="Refresh every (s, 0 = never)",
        min_value=0,
        max_value=3600,
        required=False,
        initial=DEFAULT_REFRESH,
        widget=forms.NumberInput(attrs={"class": "vIntegerField"}),
    )

    def settings(self) -> tuple[int, int]:
        """(window minutes, refresh seconds); the defaults when the input is invalid."""
        if not self.is_bound or not self.is_valid():
            return self.DEFAULT_WINDOW, self.DEFAULT_REFRESH
        refresh = self.cleaned_data["refresh"]
        refresh = self.DEFAULT_REFRESH if refresh is None else refresh
        if 0 < refresh < 5:
            refresh = 5  # a page that reloads faster than it renders helps nobody
        return self.cleaned_data["window"], refresh


class PauseForm(forms.Form):
    """Pause or resume one queue or work type: what, and why (recorded with it)."""

    action = forms.ChoiceField(choices=[("pause", "Pause"), ("resume", "Resume")])
    kind = forms.ChoiceField(choices=PauseKind.choices, label="What")
    name = forms.CharField(max_length=255, strip=False, label="Name")
    reason = reason_field()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields[
            "reason"
        ].help_text = (
            "Required. Recorded with your user name in the pauses table and the admin log."
        )
