"""Operator actions on every item matching a selection: a list filter, an error group.

The confirmation page states how many items match now and refuses more than
`BULK_LIMIT` (narrow the selection instead). It carries the selection it
showed in two hidden fields: `expected`, how many items matched, and
`fingerprint`, which ones in which status with which lease
(`Selection.fingerprint`: a digest of their sorted ids, statuses and lease
tokens). Confirming evaluates the selection again (`confirmed`) and compares
both: unless the same count AND the same items in the same statuses and
leases match now, nothing is written and the page is shown again with an
error and the count and fingerprint of now. So items that changed meanwhile
are never acted on unseen, not even when as many others took their place
(three failed items retried, three others failed), nor when a filter still
matches an item whose status changed (a failed item of an unfiltered list
retried meanwhile: pending, which a delete also accepts) or that another
worker claimed again (in progress still, under a new token). A count or
fingerprint missing or malformed is an altered page: nothing is written
either. Otherwise it calls `leasing.services.operations.apply_action` once
per item, fenced by the status and lease token confirmed (never read again:
a claim after the confirmation is skipped too): an item whose status or
lease moves on while the action runs, or that is not in a status the action
applies to, is skipped and counted. A renewal (the same token, a later
heartbeat) is no change of lease here: a digest of heartbeats would refuse
every confirmation of running items, so a bulk force-release or force-fail
takes a lease the page counted even if its worker renewed it since.
Every change is audited twice: the item's `state_transition` checkpoint (by
the service) and an admin log entry naming the selection and the reason.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.contrib import messages
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.db.models import QuerySet
from django.http import HttpRequest
from django.template.response import TemplateResponse

from ..conf import WRITE_DATABASE
from ..exceptions import LeasingError, WorkItemNotFound
from ..models import WorkItem
from ..services import operations
from ..services.dependencies import dependencies_first
from ..states import WorkItemStatus
from .forms import FINGERPRINT_DIGITS, BulkActionForm
from .wording import ACTION_TEXT

if TYPE_CHECKING:
    from .options import WorkItemAdmin

BULK_LIMIT = 1000
BULK_FIELD = "_leasing_bulk"


@dataclass(frozen=True, slots=True)
class Selection:
    """The items a bulk action would change now (at most `BULK_LIMIT + 1` ids read), and
    the status and lease token of each (`statuses[n]` and `tokens[n]` are those of
    `ids[n]`)."""

    description: str
    ids: tuple[str, ...]
    statuses: tuple[str, ...]
    tokens: tuple[int, ...]

    @property
    def over_limit(self) -> bool:
        return len(self.ids) > BULK_LIMIT

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def fingerprint(self) -> str:
        """Which items match in which status under which lease, not only how many: the
        first 16 hex digits of the SHA-256 of `id status token` lines, sorted (whatever
        order the database read them in)."""
        rows = zip(self.ids, self.statuses, self.tokens, strict=True)
        lines = sorted(f"{pk} {status} {token}" for pk, status, token in rows)
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:FINGERPRINT_DIGITS]

    def status_of(self) -> dict[str, str]:
        return dict(zip(self.ids, self.statuses, strict=True))

    def token_of(self) -> dict[str, int]:
        return dict(zip(self.ids, self.tokens, strict=True))


def select(queryset: QuerySet[WorkItem], description: str) -> Selection:
    rows = list(queryset.order_by().values_list("pk", "status", "lease_token")[: BULK_LIMIT + 1])
    return Selection(
        description,
        tuple(r[0] for r in rows),
        tuple(r[1] for r in rows),
        tuple(r[2] for r in rows),
    )


def failed_selection(description: str, ids: list[str], *, using: str) -> Selection:
    """A selection of items read as failed (an error group's members), with their lease
    tokens read on `using` (an id gone meanwhile is left out)."""
    tokens = dict(WorkItem.objects.using(using).filter(pk__in=ids).values_list("pk", "lease_token"))
    kept = tuple(pk for pk in ids if pk in tokens)
    return Selection(
        description, kept, (WorkItemStatus.FAILED,) * len(kept), tuple(tokens[pk] for pk in kept)
    )


ALTERED = (
    "The confirmation page was altered or is incomplete (the count of items it showed, or "
    "the fingerprint of which ones, is missing or malformed); nothing was changed. Review "
    "the selection and confirm again."
)


def _items(count: int) -> str:
    return f"{count:,} work item{'s' if count != 1 else ''}"


def blank_form(selection: Selection, reason: str = "") -> BulkActionForm:
    """The confirmation form for `selection` as it is now: its count and fingerprint."""
    initial = {"reason": reason, "expected": selection.count, "fingerprint": selection.fingerprint}
    return BulkActionForm(initial=initial)


def confirmed(
    modeladmin: WorkItemAdmin, request: HttpRequest, selection: Selection
) -> tuple[str | None, BulkActionForm]:
    """The reason to apply a posted confirmation to `selection` with, and the form; None
    when nothing may be applied, with the form to show the page again with.

    Applied only when the page's hidden `expected` count is the number of items
    that match now and its hidden `fingerprint` is theirs: a count or fingerprint
    the page cannot have shown (altered, lost or malformed), a count the selection
    no longer has, or as many items as then but other ones (items changed
    meanwhile) writes nothing and says so in an error; the page is shown again
    with the count and fingerprint of now and the reason given, to be confirmed
    again. A selection over `BULK_LIMIT` is refused by the page itself, a missing
    reason by the form's error.
    """
    form = BulkActionForm(request.POST)
    if selection.over_limit:
        return None, form
    valid = form.is_valid()
    if "expected" in form.errors or "fingerprint" in form.errors:
        message = ALTERED
    elif not valid:
        return None, form
    elif form.cleaned_data["expected"] != selection.count:
        now, then = selection.count, form.cleaned_data["expected"]
        message = (
            f"The selection changed after the page was shown: {_items(now)} "
            f"match{'es' if now == 1 else ''} now, {then:,} did then ({selection.description}); "
            "nothing was changed. Check the count and confirm again."
        )
    elif form.cleaned_data["fingerprint"] != selection.fingerprint:
        now = selection.count
        message = (
            f"The selection changed after the page was shown: {_items(now)} "
            f"match{'es' if now == 1 else ''} now, as many as then, but not the same "
            f"one{'s' if now != 1 else ''}, or not in the same status or lease "
            f"({selection.description}); "
            "nothing was changed. Check the items and confirm again."
        )
    else:
        return form.cleaned_data["reason"], form
    modeladmin.message_user(request, message, messages.ERROR)
    return None, blank_form(selection, request.POST.get("reason", ""))


def confirmation_page(
    modeladmin: WorkItemAdmin,
    request: HttpRequest,
    *,
    action: str,
    selection: Selection,
    form: BulkActionForm,
    post_url: str,
    hidden: dict[str, str],
    cancel_url: str,
    listing: list[dict[str, Any]] | None = None,
) -> TemplateResponse:
    """`listing`: the items the action will touch, shown above the form (the first ones)."""
    text = ACTION_TEXT[action]
    site = modeladmin.admin_site
    context = {
        **site.each_context(request),
        "title": f"{text['verb']} {selection.description}: are you sure?",
        "subtitle": None,
        "opts": modeladmin.opts,
        "media": modeladmin.media,
        "action_text": text,
        "selection": selection,
        "limit": BULK_LIMIT,
        "form": form,
        "post_url": post_url,
        "hidden": {**hidden, BULK_FIELD: "yes"},
        "cancel_url": cancel_url,
        "listing": listing or [],
    }
    request.current_app = site.name
    return TemplateResponse(request, "admin/leasing/workitem/bulk_confirmation.html", context)


def apply(
    modeladmin: WorkItemAdmin,
    request: HttpRequest,
    *,
    action: str,
    selection: Selection,
    reason: str,
) -> None:
    """Apply `action` to each selected item; report the counts and log what changed."""
    actor = request.user.get_username()
    # The fence of each change: the lease token the confirmed page counted (its
    # fingerprint matched), not one read now, which would take a lease claimed since.
    tokens = selection.token_of()
    # A deleted row cannot be read back for its log entry: read them before.
    before = _objects(list(selection.ids)) if action == operations.Action.DELETE else {}
    applied: list[str] = []
    skipped: Counter[str] = Counter()
    dependents: Counter[str] = Counter()  # what the actions did to their dependents
    # The status of each as the confirmed page showed it (its fingerprint matched).
    statuses = selection.status_of()
    ids = list(selection.ids)
    if action == operations.Action.RETRY:  # dependencies first: their dependents follow them
        ids = dependencies_first(ids, using=WRITE_DATABASE)
    for item_id in ids:
        try:
            result = operations.apply_action(
                action,
                item_id,
                expected_token=tokens[item_id],
                expected_status=statuses[item_id],
                actor=actor,
                reason=reason,
            )
        except WorkItemNotFound:
            skipped["it no longer exists"] += 1
            continue
        except LeasingError as exc:
            skipped[str(exc)] += 1
            continue
        if result.applied:
            applied.append(item_id)
            dependents["failed"] += result.dependents_failed
            dependents["still_failed"] += result.dependents_still_failed
        else:
            skipped[result.detail.removeprefix("skipped: ")] += 1
    text = ACTION_TEXT[action]
    if applied:
        message = f"{text['verb']} (bulk: {selection.description}): {reason}"
        assert request.user.pk is not None  # the admin serves signed-in staff only
        if before:
            gone = [before[pk] for pk in applied if pk in before]
            LogEntry.objects.log_actions(request.user.pk, gone, DELETION, message)
        else:
            LogEntry.objects.log_actions(
                request.user.pk, list(_objects(applied).values()), CHANGE, message
            )
        modeladmin.message_user(
            request,
            f"{len(applied):,} work item{'s' if len(applied) != 1 else ''} {text['done']} "
            f"({selection.description}).",
            messages.SUCCESS,
        )
    if dependents["failed"]:
        modeladmin.message_user(
            request,
            f"{dependents['failed']:,} dependent item(s) failed with them.",
            messages.WARNING,
        )
    if dependents["still_failed"]:
        modeladmin.message_user(
            request,
            f"{dependents['still_failed']:,} dependent item(s) that failed with their "
            "dependencies stay failed: retry them too, and they wait for them again.",
            messages.WARNING,
        )
    for why, count in skipped.most_common(5):
        modeladmin.message_user(request, f"{count:,} skipped: {why}.", messages.WARNING)
    if not applied and not skipped:
        modeladmin.message_user(request, "Nothing matched any more; nothing changed.")


def _objects(item_ids: list[str]) -> dict[str, Any]:
    """The items by id, read on the primary, without their payloads."""
    items: Any = WorkItem.objects.using(WRITE_DATABASE).defer("input_data", "output_data")
    return dict(items.in_bulk(item_ids))
