"""Django admin autodiscovery imports ``commands.admin``: the registrations live in ``commands.staff``."""

from commands.staff import admin  # noqa: F401
