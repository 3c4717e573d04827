"""Connector health in the admin: the connector list's columns, the connector page's table and the
dashboard's worst few — all read from ``commands.health_figures.figures`` (three queries per page, however
many connectors and attempts), never from the attempts table."""

from __future__ import annotations

from datetime import datetime
from urllib.parse import urlencode

from django.contrib import admin
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.text import Truncator

from commands import health_figures
from commands.staff.explain import SKIP_REASONS

# The dashboard shows this many connectors, longest run of failures first.
WORST_SHOWN = 5


def attach(connectors, now: datetime | None = None) -> None:
    """Give each connector of a page its ``glance_health`` (one :func:`health_figures.figures` call)."""
    found = health_figures.figures([c.pk for c in connectors], now)
    for connector in connectors:
        connector.glance_health = found.get(connector.pk)


def capped(n: int) -> str:
    return f"more than {health_figures.CAP:,}" if n > health_figures.CAP else f"{n:,}"


def rate_text(window: health_figures.Window) -> str:
    return f"{round(100 * window.rate)}% of {window.sends:,}" if window.sends else "-"


def when(moment: datetime | None) -> str:
    return date_format(timezone.localtime(moment), "Y-m-d H:i:s T") if moment else "-"


def reason_label(key: str) -> tuple[str, str]:
    meaning = SKIP_REASONS.get(key)
    return (meaning.label, meaning.tone) if meaning else ("deciding", "wait")


def waiting_badges(figures: health_figures.Health) -> SafeString | str:
    """Each reason its failed commands wait for, with its (capped) count, linked to the failed
    list filtered to that connector and reason."""
    url = reverse("admin:commands_failedcommand_changelist")
    shown = []
    for key in health_figures.WAIT_KEYS:
        n = figures.waiting.get(key, 0)
        if n:
            label, tone = reason_label(key)
            link = url + "?" + urlencode({"connector__id__exact": figures.connector_id, "reason": key})
            shown.append((link, tone, label, capped(n)))
    if not shown:
        return "-"
    return format_html_join(
        " ", '<a href="{}"><span class="ankusa-badge ankusa-tone-{}">{}</span> {}</a>', shown
    )


def send_times(window: health_figures.Window) -> str:
    if not window.sends:
        return "-"
    return f"p50 {health_figures.seconds_text(window.quantile(0.5))} · p95 {health_figures.seconds_text(window.quantile(0.95))}"


def last_error_text(figures: health_figures.Health) -> SafeString | str:
    if figures.last_error_at is None:
        return "-"
    return format_html(
        '<code>{}</code> {} <span class="ankusa-when">{}</span>',
        figures.last_error_class or "?",
        Truncator(figures.last_error).chars(60),
        when(figures.last_error_at),
    )


class HealthColumns:
    """The connector list's health columns (each row's ``glance_health``, set by :func:`attach`)."""

    def _health(self, connector) -> health_figures.Health:
        return getattr(connector, "glance_health", None) or health_figures.Health(connector.pk)

    # Two figures a cell, one a line: the list fits a laptop's screen without scrolling sideways.
    @admin.display(description="ok: 1 h, 24 h")
    def health_rates(self, connector):
        figures = self._health(connector)
        return format_html("{}<br>{}", rate_text(figures.hour), rate_text(figures.day))

    @admin.display(description="send, 24 h")
    def health_send_time(self, connector):
        day = self._health(connector).day
        if not day.sends:
            return "-"
        return format_html(
            "p50 {}<br>p95 {}",
            health_figures.seconds_text(day.quantile(0.5)),
            health_figures.seconds_text(day.quantile(0.95)),
        )

    def success_rate(self, connector) -> str:
        return rate_text(self._health(connector).day)

    @admin.display(description="fails in a row")
    def health_run(self, connector) -> str:
        return f"{self._health(connector).consecutive_failures:,}"

    @admin.display(description="failed, by reason")
    def health_waiting(self, connector):
        return waiting_badges(self._health(connector))


def page_table(connector) -> SafeString:
    """The connector page's health table."""
    figures = (
        getattr(connector, "glance_health", None) or health_figures.figures([connector.pk])[connector.pk]
    )
    rows = [
        ("sends, last hour", rate_text(figures.hour)),
        ("send time, last hour", send_times(figures.hour)),
        ("sends, last 24 h", rate_text(figures.day)),
        ("send time, last 24 h", send_times(figures.day)),
        ("failures in a row", f"{figures.consecutive_failures:,}"),
        ("last failed send", last_error_text(figures)),
        ("last successful send", when(figures.last_ok_at)),
        ("failed, waiting for", waiting_badges(figures)),
        ("waiting to go", capped(figures.waiting.get(health_figures.TO_GO, 0))),
    ]
    return format_html(
        '<table class="ankusa-health">{}</table>',
        format_html_join("", "<tr><th>{}</th><td>{}</td></tr>", rows),
    )


def worst_connectors(now: datetime | None = None) -> list[dict]:
    """The dashboard's worst few: name, link and figures of the connectors failing longest."""
    shown = []
    for connector, figures in health_figures.worst(WORST_SHOWN, now):
        shown.append(
            {
                "name": str(connector),
                "url": reverse("admin:commands_connector_change", args=[connector.pk]),
                "run": figures.consecutive_failures,
                "hour": rate_text(figures.hour),
                "day": rate_text(figures.day),
                "send_time": send_times(figures.hour),
                "last_error": last_error_text(figures),
                "waiting": waiting_badges(figures),
            }
        )
    return shown
