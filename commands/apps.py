from django.apps import AppConfig
from django.core.checks import register
from django.db.models.signals import post_migrate, post_save


def sync_staff_groups(sender, apps=None, **kwargs) -> None:
    """After every ``migrate`` (and a test database's flush, which empties the groups): the staff
    groups exist with at least the permissions this version grants them."""
    from django.apps import apps as installed

    from commands.staff import staff_groups

    staff_groups.sync(apps or installed)  # flush sends no ``apps``: the installed ones


def reconsider_saved_connector(sender, instance, raw=False, **kwargs) -> None:
    """A saved connector's commands decided again, in its save's transaction (``Connector.save``).
    Not for a fixture's raw save, which never ran ``save()`` either."""
    if raw:
        return
    from commands.staff.reconsider import reconsider

    instance.reconsidered = reconsider(instance)


class CommandsConfig(AppConfig):
    name = "commands"
    verbose_name = "Commands"

    def ready(self) -> None:
        post_migrate.connect(sync_staff_groups, sender=self, dispatch_uid="commands.sync_staff_groups")
        post_save.connect(
            reconsider_saved_connector,
            sender=self.get_model("Connector"),
            dispatch_uid="commands.reconsider_saved_connector",
        )
        from commands.checks import check_connectors

        register(check_connectors)
        from ankusa_site.core.metrics import register_collector
        from commands.metrics import CommandsCollector

        register_collector("commands", CommandsCollector())
