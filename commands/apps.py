from django.apps import AppConfig
from django.core.checks import register
from django.db.models.signals import post_migrate


def sync_staff_groups(sender, apps=None, **kwargs) -> None:
    """After every ``migrate`` (and a test database's flush, which empties the groups): the staff
    groups exist with at least the permissions this version grants them."""
    from django.apps import apps as installed

    from commands.staff import staff_groups

    staff_groups.sync(apps or installed)  # flush sends no ``apps``: the installed ones


class CommandsConfig(AppConfig):
    name = "commands"
    verbose_name = "Commands"

    def ready(self) -> None:
        post_migrate.connect(sync_staff_groups, sender=self, dispatch_uid="commands.sync_staff_groups")
        from commands.checks import check_connectors

        register(check_connectors)
        from ankusa_site.core.metrics import register_collector
        from commands.metrics import CommandsCollector

        register_collector("commands", CommandsCollector())
