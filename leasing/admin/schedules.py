"""The admin of periodic work: the `schedules` table.

Admin schedules are added, edited and deleted here; schedules from
`LEASING["SCHEDULES"]` are shown read-only, except their `enabled` switch
(the settings define them; the scheduler syncs them on start). Every write
goes through `leasing.services.schedules`; the form validates the cron
expression, the time zone and the payload with the same parser as the
settings (`leasing.ticks`), so bad input is a field error, never a 500.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db.models import BooleanField, QuerySet, Value
from django.db.models.functions import Now
from django.forms.fields import InvalidJSONInput
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from .. import validation
from ..conf import get_settings
from ..console.durations import EMPTY, duration
from ..exceptions import InvalidInput
from ..handlers import registry as handlers
from ..models import Schedule
from ..services import schedules as service
from ..services.schedules import PASS_INTERVAL
from ..ticks import (
    ScheduleSpec,
    check_item_input,
    parse_cron,
    parse_every,
    parse_missed,
    parse_name,
    parse_payload,
    parse_text,
    parse_timezone,
    parse_timing,
)
from . import display
from .changelist import CheckedLookups
from .guards import first_unstorable, not_integer_ids, refusal_message

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

    _ModelForm = forms.ModelForm[Schedule]
    _ModelAdmin = admin.ModelAdmin[Schedule]
else:  # Django's classes are not subscriptable at run time
    _ModelForm = forms.ModelForm
    _ModelAdmin = admin.ModelAdmin


class RowContext(TypedDict):
    """The list's and the change page's annotations: the database clock, and whether the
    viewer may read error text (`display.errors_visible`; columns are not given the request)."""

    db_now: datetime
    errors_visible: bool


type ClockedSchedule = WithAnnotations[Schedule, RowContext]

# A next run further in the past than this is overdue: a live scheduler enqueues a
# tick at most one pass late, so three passes missed means none is running (or
# this schedule fails each pass).
OVERDUE_AFTER = 3 * PASS_INTERVAL

# Set on a request whose save the service refused (`ScheduleAdmin.save_model`).
REFUSED = "leasing_schedule_refused"

DEFINITION = ("work_type", "cron", "every", "timezone", "payload", "queue_name", "missed")
TIMING = ("cron", "every", "timezone")


def _has_handler(work_type: str) -> bool:
    """Items of this work type can run (as this process's registry knows it)."""
    return work_type in handlers or get_settings().allow_unregistered_types


def _field[T](parse: Callable[..., T], value: Any, *args: Any) -> T:
    """Run a parser, turning its InvalidInput into the field's ValidationError."""
    try:
        return parse(*args, value)
    except InvalidInput as exc:
        raise forms.ValidationError(str(exc)) from None


class PayloadField(forms.JSONField):
    """The payload as JSON text: a form error for any bad text, never a 500.

    A bound form shows the text as typed. Django's field would parse it and
    encode it again, which fails for a lone surrogate (written `\\ud800` in the
    JSON, the page then cannot be encoded) and for JSON nested deeper than the
    interpreter's stack (RecursionError), as parsing it does. Django's field
    turns only a syntax error into a form error: an integer longer than Python
    converts (4,300 digits) raises a plain ValueError.
    """

    def to_python(self, value: Any) -> Any:
        try:
            return super().to_python(value)
        except RecursionError:
            raise forms.ValidationError(
                f"payload is nested more than {validation.MAX_JSON_DEPTH} levels deep.",
                code="invalid",
            ) from None
        except ValueError as exc:
            raise forms.ValidationError(
                f"payload is not valid JSON: {exc}".split("; use")[0], code="invalid"
            ) from None

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled or not isinstance(data, str):
            return super().bound_data(data, initial)
        return InvalidJSONInput(data)


class ScheduleForm(_ModelForm):
    class Meta:
        model = Schedule
        fields = ("name", *DEFINITION, "enabled")
        field_classes = {"payload": PayloadField}

    spec: ScheduleSpec | None = None

    def _text(self, name: str) -> str:
        value = self.cleaned_data.get(name) or ""
        _field(validation.storable_text, value, name)
        return value

    def clean_name(self) -> str:
        return _field(parse_name, self._text("name"))

    def clean_work_type(self) -> str:
        work_type = _field(parse_text, self._text("work_type"), "work_type")
        # The stored row's own work type is kept even if its handler went away: an
        # operator can still switch the schedule off or edit it (`save_model` warns
        # while it stays on). Only a new or changed one must have a handler.
        kept = self.instance.pk is not None and work_type == self.instance.work_type
        if not kept and not _has_handler(work_type):
            raise forms.ValidationError(
                f"No handler is registered for work type {work_type!r}: its items would never "
                "run. Register one with @leasing.handler."
            )
        return work_type

    def clean_queue_name(self) -> str:
        return _field(parse_text, self._text("queue_name"), "queue")

    def clean_cron(self) -> str:
        cron = self._text("cron").strip()
        return _field(parse_cron, cron) if cron else ""

    def clean_every(self) -> int | None:
        every = self.cleaned_data.get("every")
        return None if every is None else _field(parse_every, every)

    def clean_timezone(self) -> str:
        return _field(parse_timezone, self._text("timezone").strip())

    def clean_missed(self) -> str:
        return _field(parse_missed, self.cleaned_data.get("missed"))

    def clean_payload(self) -> dict[str, Any]:
        # NUL, lone surrogates, size and depth, as the settings' schedules.
        return _field(parse_payload, self.cleaned_data.get("payload"))

    def clean(self) -> dict[str, Any]:
        super().clean()
        data = self.cleaned_data
        if "work_type" not in self.fields:
            return data  # a settings schedule: only `enabled` is on the form
        if self.errors:
            return data
        try:
            timing = parse_timing(data.get("cron") or None, data.get("every"), data["timezone"])
        except InvalidInput as exc:
            raise forms.ValidationError(
                "Give either a cron expression or an interval in seconds (every), not both."
                if "exactly one" in str(exc)
                else str(exc)
            ) from None
        spec = ScheduleSpec(
            name=data["name"],
            work_type=data["work_type"],
            timing=timing,
            payload=data.get("payload") or {},
            queue=data["queue_name"],
            missed=data["missed"],
        )
        try:
            check_item_input(spec)  # the payload with its `_schedule` entry still fits
        except InvalidInput as exc:
            self.add_error("payload", str(exc))
            return data
        self.spec = spec
        return data


@admin.register(Schedule)
class ScheduleAdmin(CheckedLookups, _ModelAdmin):
    form = ScheduleForm
    list_display = (
        "name",
        "timing",
        "timezone",
        "work_type",
        "enabled",
        "next_run",
        "last_failure",
        "last_run",
        "last_item",
        "source",
    )
    list_filter = ("enabled", "from_settings")
    search_fields = ("name", "work_type")
    ordering = ("name",)
    actions = ("enable_selected", "disable_selected")
    list_per_page = 100

    class Media:
        css = {"all": ["leasing/admin.css"]}  # the overdue mark's colour

    def get_queryset(self, request: HttpRequest) -> QuerySet[ClockedSchedule]:
        # `db_now`: the database clock, which the scheduler's passes also read.
        visible = Value(display.errors_visible(request.user), output_field=BooleanField())
        return super().get_queryset(request).annotate(db_now=Now(), errors_visible=visible)

    # --- bad input in the list's search, filters or selection: a message, never a 500 ---

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        name = first_unstorable(request.GET, request.POST)
        refusal: str | None
        if name is not None:
            refusal = refusal_message(f"parameter {name}")
        else:
            refusal = self._bad_selection(request)
        if refusal is None:
            return super().changelist_view(request, extra_context)
        self.message_user(request, refusal, messages.ERROR)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:leasing_schedule_changelist"))

    def _bad_selection(self, request: HttpRequest) -> str | None:
        """Why an action's selection is refused (ids that are not schedule ids), if it is."""
        if request.method != "POST" or "action" not in request.POST:
            return None
        bad = not_integer_ids(request.POST.getlist(ACTION_CHECKBOX_NAME))
        if not bad:
            return None
        shown = ", ".join(repr(pk[:50]) for pk in bad[:5])
        return f"The selection has ids that are not schedule ids ({shown}); nothing was changed."

    # --- columns -------------------------------------------------------------------------

    @admin.display(description="cron / interval")
    def timing(self, obj: Schedule) -> str:
        return obj.timing_text

    @admin.display(description="next run at", ordering="next_run_at")
    def next_run(self, obj: ClockedSchedule) -> SafeString | str:
        if obj.next_run_at is None:
            return EMPTY
        shown = display.timestamp(obj.next_run_at)
        late = (obj.db_now - obj.next_run_at).total_seconds()
        if not obj.enabled or late <= OVERDUE_AFTER:
            return shown  # a disabled schedule keeps its next run, and owes nothing
        overdue = format_html(
            '{} <span class="leasing-bad-text leasing-overdue" title="No scheduler enqueued '
            "this tick within {} of it: is manage.py runscheduler running, and does its log "
            'name this schedule?">overdue by {}</span>',
            shown,
            duration(OVERDUE_AFTER),
            duration(late),
        )
        if obj.last_error or _has_handler(obj.work_type):
            return overdue  # a recorded failure says why (`last_failure`)
        # The commonest cause, which the scheduler's log names: say it here too (until the
        # scheduler records the failure it hit).
        return format_html(
            '{}: <span class="leasing-bad-text">no handler is registered for its work type '
            "{}, so the scheduler cannot enqueue its ticks</span>",
            overdue,
            repr(obj.work_type),
        )

    @admin.display(description="last failure")
    def last_failure(self, obj: ClockedSchedule) -> SafeString | str:
        """Why the scheduler could not enqueue the tick it owes, as it recorded it.

        Error text may quote data, so only `leasing.view_payload` holders read it
        (the console's rule); a disabled schedule owes no tick, so shows none.
        """
        if not obj.enabled or not obj.last_error:
            return EMPTY
        since = display.timestamp(obj.last_error_at)
        if not obj.errors_visible:
            return format_html(
                '<span class="leasing-redacted">{}</span> (since {})', display.ERROR_HIDDEN, since
            )
        return format_html(
            '<span class="leasing-bad-text" title="The scheduler cannot enqueue this '
            "schedule's tick and retries each pass; this clears once a tick is enqueued or the "
            'schedule is edited.">{}</span> (since {})',
            obj.last_error,
            since,
        )

    last_tick = display.time_column("last_tick_at", "last tick at")
    last_run = display.time_column("last_run_at", "last run at")

    @admin.display(description="last item")
    def last_item(self, obj: Schedule) -> SafeString | str:
        if not obj.last_work_item_id:
            return "-"
        return display.work_item_link(self.admin_site.name, obj.last_work_item_id)

    @admin.display(description="defined in", boolean=False)
    def source(self, obj: Schedule) -> SafeString:
        if obj.from_settings:
            return format_html("<code>{}</code>", "LEASING['SCHEDULES']")
        return format_html("{}", "admin")

    # --- what may change -------------------------------------------------------------------

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> tuple[str, ...]:
        state = ("next_run", "last_failure", "last_tick", "last_run", "last_item", "source")
        if obj is not None and obj.from_settings:
            return ("name", *DEFINITION, *state)
        return state if obj is not None else ()

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        if obj is not None and obj.from_settings:
            return False  # remove it from LEASING["SCHEDULES"] instead
        return super().has_delete_permission(request, obj)

    # --- writes, through the service -------------------------------------------------------

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        changed = set(form.changed_data)
        try:
            if change and obj.from_settings:
                if "enabled" in changed:
                    refused: list[str] = []
                    service.set_enabled([obj.pk], obj.enabled, refused=refused)
                    if refused:
                        raise InvalidInput(refused[0])
                return
            assert form.spec is not None  # clean() built it
            retime = bool(changed & set(TIMING)) or ("enabled" in changed and obj.enabled)
            obj.pk = service.save_schedule(
                form.spec, enabled=obj.enabled, pk=obj.pk if change else None, retime=retime
            )
        except InvalidInput as exc:
            self.message_user(request, str(exc), messages.ERROR)
            request.__dict__[REFUSED] = True  # no "changed successfully", no history entry
            return
        if obj.enabled and not _has_handler(obj.work_type):
            self.message_user(
                request,
                f"Schedule {obj.name!r} is enabled, but no handler is registered for its work "
                f"type {obj.work_type!r}: its ticks are not enqueued (the scheduler logs each "
                "failure and retries) until one is registered with @leasing.handler. Disable "
                "it to stop them.",
                messages.WARNING,
            )
        if obj.pk:
            obj.refresh_from_db()  # show what the service wrote (next_run_at, ...)

    def log_change(self, request: HttpRequest, obj: Any, message: Any) -> Any:
        if request.__dict__.get(REFUSED):
            return None  # the service refused the save: nothing changed
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Schedule) -> HttpResponse:
        if request.__dict__.get(REFUSED):
            # Back to the form, whose message says why nothing changed.
            return HttpResponseRedirect(request.get_full_path())
        return super().response_change(request, obj)

    def save_related(self, request: HttpRequest, form: Any, _formsets: Any, change: bool) -> None:
        pass  # no related rows, and the instance was written by the service

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        service.delete_schedules([obj.pk])

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        kept = queryset.filter(from_settings=True).count()
        service.delete_schedules(list(queryset.values_list("pk", flat=True)))
        if kept:
            self.message_user(
                request,
                f"{kept} schedule(s) from LEASING['SCHEDULES'] were kept: remove them from the "
                "settings instead.",
                messages.WARNING,
            )

    # --- actions ---------------------------------------------------------------------------

    @admin.action(
        description="Enable the selected schedules (from their next tick)", permissions=["change"]
    )
    def enable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        refused: list[str] = []
        pks = list(queryset.values_list("pk", flat=True))
        count = service.set_enabled(pks, True, refused=refused)
        for why in refused:  # the others were switched on all the same
            self.message_user(request, why, messages.ERROR)
        if count or not refused:
            self.message_user(request, f"{count} schedule(s) enabled.", messages.SUCCESS)
        # As the change form warns: on, yet nothing can run their items.
        orphans = sorted(
            f"{name!r} ({work_type!r})"
            for name, work_type in Schedule.objects.filter(pk__in=pks, enabled=True).values_list(
                "name", "work_type"
            )
            if not _has_handler(work_type)
        )
        if orphans:
            self.message_user(
                request,
                f"No handler is registered for the work type of {', '.join(orphans)}: their "
                "ticks are not enqueued (the scheduler logs each failure and retries) until one "
                "is registered with @leasing.handler.",
                messages.WARNING,
            )

    @admin.action(description="Disable the selected schedules", permissions=["change"])
    def disable_selected(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        count = service.set_enabled(list(queryset.values_list("pk", flat=True)), False)
        self.message_user(request, f"{count} schedule(s) disabled.", messages.SUCCESS)
