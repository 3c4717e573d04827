"""Django's admin autodiscovery imports ``commands.admin``: this registers the admin pages of ``commands.staff``."""

from commands.staff import admin_commands, admin_connectors, admin_history  # noqa: F401
