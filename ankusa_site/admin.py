"""What every admin page of the site shares: the ``ModelAdmin`` its model admins derive from.

Django's action handling filters the changelist by the posted ids as they come, so a forged id
(``_selected_action=abc`` on an integer key) ends as a 500. Here every action first checks that
each selected id is one the primary key can hold and answers with a message otherwise.
``selected_across`` reads "every row that matches the filter" as Django's own action form does,
for confirmation pages that post it back.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import ValidationError


def selected_across(request) -> bool:
    """The action form's ``select_across``, read as Django reads it."""
    return forms.BooleanField(required=False).to_python(request.POST.get("select_across"))


class ModelAdmin(admin.ModelAdmin):
    def response_action(self, request, queryset):
        key = self.model._meta.pk
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                key.to_python(value)
            except ValidationError:
                plural = self.model._meta.verbose_name_plural
                self.message_user(
                    request, f"The selection holds {value[:40]!r}: not an id of {plural}.", messages.ERROR
                )
                return None
        return super().response_action(request, queryset)
