import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "ankusa_site.settings")


def get_site_application():
    """Django's ``get_wsgi_application``, with the site's handler (``ankusa_site.handlers``)."""
    django.setup(set_prefix=False)
    from ankusa_site.handlers import SiteWSGIHandler

    return SiteWSGIHandler()


application = get_site_application()
