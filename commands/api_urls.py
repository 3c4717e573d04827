"""REST endpoints of the commands app, mounted under /api/v1/ by ankusa_site.urls."""

from django.urls import path

from commands.intake_api import CommandSubmitView

urlpatterns = [
    # POST only for now; the staff API's command viewset takes this path over and calls
    # commands.intake_api.submit for its POST.
    path("commands/", CommandSubmitView.as_view(), name="commands-submit"),
]
