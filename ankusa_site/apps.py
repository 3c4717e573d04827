from django.apps import AppConfig


class SiteConfig(AppConfig):
    name = "ankusa_site"
    verbose_name = "Ankusa site"

    def ready(self):
        from ankusa_site import checks  # noqa: F401 - registers the system checks
