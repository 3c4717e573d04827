"""The admin index's dashboard: what is waiting and why, the queues, and 24 hours of attempts.

Read-only. Each figure is one GROUP BY query, never one per row or per state: commands by state,
failed commands by why they wait (the badge's rule, ``admin_lists.waits_for``), and attempts that
finished in the last 24 hours by hour and outcome. The queues come from ``queues.actions.overview``;
a backend that fails (Redis down) is a line on the page, never an error page. Whether the dispatch
loop is alive comes from ``commands.dispatch.heartbeat`` (each process's last round, and a warning when none
ran recently); the connectors failing the longest run from ``commands.health``'s summary. The page reloads itself every ``REFRESH_S`` seconds.

The chart is SVG made here, on the server, and inlined in the page: no JavaScript, no CDN, so the
admin works offline. Outcomes: ``ok``; ``failed`` by the adapter's outlook (``again``,
``after-fix``, ``never``); ``unknown`` (no outlook, or a send whose worker died).

What it does not do: count attempts still in flight (they have no finish time yet), or stay cheap
on a huge attempts table without an index on ``Attempt.finished_at``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count
from django.db.models.functions import TruncHour
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from commands.dispatch import heartbeat
from commands.models import Attempt, Command
from commands.retry import Outlook
from commands.staff import health_admin
from commands.staff.admin_lists import NO_REASON, waits_for
from commands.staff.explain import SKIP_REASONS
from commands.states import State

# The chart's series, bottom to top, with their colours (the badges' tones where they match).
OUTCOMES = [
    ("ok", "ok", "#3c8d40"),
    (Outlook.AGAIN.value, "failed: again", "#2f6f9f"),
    (Outlook.AFTER_FIX.value, "failed: after fix", "#b35c00"),
    (Outlook.NEVER.value, "failed: never", "#a12b2b"),
    ("unknown", "unknown", "#8a8a8a"),
]
HOURS = 24
REFRESH_S = 30


def state_counts() -> list[tuple[str, str, int]]:
    """``(state, label, count)`` for every state, zeros included (one GROUP BY)."""
    counted = dict(Command.objects.order_by().values_list("state").annotate(n=Count("pk")))
    return [(state.value, state.label, counted.get(state.value, 0)) for state in State]


def reason_counts() -> list[tuple[str, str, str, int]]:
    """``(key, label, tone, count)`` of failed commands by why they wait, largest first (one GROUP BY)."""
    rows = (
        Command.objects.filter(state=State.FAILED)
        .order_by()
        .values_list("skip_reason", "last_outlook")
        .annotate(n=Count("pk"))
    )
    totals: dict[str, int] = {}
    for skip_reason, outlook, n in rows:
        key = waits_for(skip_reason, outlook)
        totals[key] = totals.get(key, 0) + n
    found = []
    for key, n in totals.items():
        explanation = SKIP_REASONS.get(key)
        if explanation is None:
            label = "no reason yet (decided at the next sweep)" if key == NO_REASON else key
            found.append((key, label, "none", n))
        else:
            found.append((key, explanation.label, explanation.tone, n))
    return sorted(found, key=lambda row: (-row[3], row[1]))


def outcome(ok: bool | None, outlook: str) -> str:
    if ok:
        return "ok"
    if ok is False and outlook in (Outlook.AGAIN, Outlook.AFTER_FIX, Outlook.NEVER):
        return outlook
    return "unknown"


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def attempt_hours(now: datetime) -> list[tuple[datetime, dict[str, int]]]:
    """The last ``HOURS`` hours (oldest first, the current one last), each with its outcome counts."""
    last = hour_floor(now)
    first = last - timedelta(hours=HOURS - 1)
    hours = [
        (first + timedelta(hours=i), dict.fromkeys((key for key, _, _ in OUTCOMES), 0)) for i in range(HOURS)
    ]
    index = dict(hours)
    rows = (
        Attempt.objects.filter(finished_at__gte=first, finished_at__lte=now)
        .order_by()
        .annotate(hour=TruncHour("finished_at"))
        .values_list("hour", "ok", "outlook")
        .annotate(n=Count("pk"))
    )
    for hour, ok, outlook, n in rows:
        counts = index.get(hour)  # aware datetimes: equal (and hashed alike) across time zones
        if counts is not None:
            counts[outcome(ok, outlook)] += n
    return hours


def outcome_chart(hours: list[tuple[datetime, dict[str, int]]]) -> SafeString:
    """A stacked bar per hour, as inline SVG (every text escaped by ``format_html``)."""
    bar, gap, left, top, plot_h, bottom = 24, 4, 40, 10, 150, 40
    width = left + len(hours) * (bar + gap) + 10
    height = top + plot_h + bottom
    peak = max([sum(counts.values()) for _, counts in hours] + [1])
    parts = [
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" stroke="#999"/>',
            left,
            top + plot_h,
            width - 10,
            top + plot_h,
        ),
        format_html(
            '<text x="{}" y="{}" font-size="10" text-anchor="end">{}</text>', left - 4, top + 8, peak
        ),
        format_html('<text x="{}" y="{}" font-size="10" text-anchor="end">0</text>', left - 4, top + plot_h),
    ]
    for i, (start, counts) in enumerate(hours):
        x = left + i * (bar + gap)
        y = top + plot_h
        for key, label, colour in OUTCOMES:
            n = counts[key]
            if not n:
                continue
            h = max(1, round(n / peak * plot_h))
            y -= h
            parts.append(
                format_html(
                    '<rect class="ankusa-bar ankusa-{}" x="{}" y="{}" width="{}" height="{}" fill="{}">'
                    "<title>{}: {} {}</title></rect>",
                    key,
                    x,
                    y,
                    bar,
                    h,
                    colour,
                    f"{start:%H}:00",
                    n,
                    label,
                )
            )
        if i % 3 == 0:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" font-size="10" text-anchor="middle">{}</text>',
                    x + bar // 2,
                    top + plot_h + 14,
                    f"{start:%H}:00",
                )
            )
    totals = {key: sum(counts[key] for _, counts in hours) for key, _, _ in OUTCOMES}
    for j, (key, label, colour) in enumerate(OUTCOMES):
        x = left + j * 130
        y = top + plot_h + 26
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="10" height="10" fill="{}"/>'
                '<text x="{}" y="{}" font-size="11">{} ({})</text>',
                x,
                y,
                colour,
                x + 14,
                y + 9,
                label,
                totals[key],
            )
        )
    return format_html(
        '<svg xmlns="http://www.w3.org/2000/svg" id="ankusa-outcomes" width="{}" height="{}" '
        'viewBox="0 0 {} {}" role="img" aria-label="{}">{}</svg>',
        width,
        height,
        width,
        height,
        f"Attempt outcomes per hour over the last {HOURS} hours",
        format_html_join("", "{}", [(part,) for part in parts]),
    )


def queue_rows() -> dict[str, Any]:
    """``queues.actions.overview()``; if even listing the queues fails, that failure is the line."""
    from queues.actions import overview

    try:
        return overview()
    except Exception as exc:  # noqa: BLE001 - the dashboard shows the problem, the index page stays up
        return {"queues": [], "problems": [f"{type(exc).__name__}: {exc}"]}


def dashboard(now: datetime | None = None) -> dict[str, Any]:
    now = now or timezone.now()
    hours = attempt_hours(now)
    queues = queue_rows()
    return {
        "dispatch": heartbeat.status(now),
        # The page reloads itself this often (a plain reload; the dashboard holds no form).
        "refresh_s": REFRESH_S,
        "states": state_counts(),
        "reasons": reason_counts(),
        "queues": queues["queues"],
        "queue_problems": queues["problems"],
        "chart": outcome_chart(hours),
        "attempts_24h": sum(sum(counts.values()) for _, counts in hours),
        # Connector health (commands.health): the few failing the longest run, from its summary.
        "worst_connectors": health_admin.worst_connectors(now),
    }
