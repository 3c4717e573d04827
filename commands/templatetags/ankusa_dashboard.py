"""``{% ankusa_dashboard %}``: the admin index's dashboard (``commands.staff.dashboard``), for staff who may
see commands. A template tag rather than a custom index view, so the site's URLs stay as they are."""

from __future__ import annotations

from django import template

from commands.staff.dashboard import dashboard

register = template.Library()


@register.inclusion_tag("admin/commands/dashboard.html", takes_context=True)
def ankusa_dashboard(context):
    request = context.get("request")
    user = getattr(request, "user", None)
    if user is None or not user.has_perm("commands.view_command"):
        return {"show": False}
    return {"show": True, **dashboard()}
