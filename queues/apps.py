from django.apps import AppConfig


class QueuesConfig(AppConfig):
    name = "queues"
    verbose_name = "Queues"

    def ready(self) -> None:
        from ankusa_site.core.metrics import register_collector
        from queues.metrics import QueuesCollector

        register_collector("queues", QueuesCollector())
