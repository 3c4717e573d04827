"""``manage.py nginx_conf``: ``deploy/nginx/ankusa.conf`` with its ``${…}`` filled in, on stdout.

The body limit comes from the site's own setting (``ANKUSA_MAX_REQUEST_BYTES``), so nginx and
Django refuse at the same size; the host names from ``ALLOWED_HOSTS``; the rest from the options,
whose defaults are the deploy units' (gunicorn on ``127.0.0.1:8000``) and Let's Encrypt's paths.
The tests render the same file with the same function, onto free ports.

A placeholder the template names and nobody fills is an error here, not an nginx variable nginx
would later refuse to know.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

TEMPLATE = Path(settings.BASE_DIR) / "deploy" / "nginx" / "ankusa.conf"
PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")


def render(values: dict[str, str], template: Path = TEMPLATE) -> str:
    """The template with every ``${NAME}`` replaced by ``values[NAME]`` and
    ``${MAX_BODY}`` by the site's ``ANKUSA_MAX_REQUEST_BYTES``."""
    values = {"MAX_BODY": str(settings.DATA_UPLOAD_MAX_MEMORY_SIZE), **values}
    missing = sorted({name for name in PLACEHOLDER.findall(template.read_text()) if name not in values})
    if missing:
        raise CommandError(f"{template.name} needs values for: {', '.join(missing)}.")
    return PLACEHOLDER.sub(lambda match: values[match.group(1)], template.read_text())


class Command(BaseCommand):
    help = "Print deploy/nginx/ankusa.conf filled in for this site."

    def add_arguments(self, parser):
        hosts = [host for host in settings.ALLOWED_HOSTS if not host.startswith(".") and host != "*"]
        first = hosts[0] if hosts else "localhost"
        parser.add_argument("--server-name", default=" ".join(hosts) or "localhost")
        parser.add_argument("--upstream", default="127.0.0.1:8000", help="gunicorn's address")
        parser.add_argument("--http-listen", default="80")
        parser.add_argument("--https-listen", default="443")
        parser.add_argument("--certificate", default=f"/etc/letsencrypt/live/{first}/fullchain.pem")
        parser.add_argument("--certificate-key", default=f"/etc/letsencrypt/live/{first}/privkey.pem")
        parser.add_argument("--log-dir", default="/var/log/nginx")

    def handle(self, *args, **options):
        self.stdout.write(
            render(
                {
                    "SERVER_NAME": options["server_name"],
                    "UPSTREAM": options["upstream"],
                    "HTTP_LISTEN": options["http_listen"],
                    "HTTPS_LISTEN": options["https_listen"],
                    "TLS_CERTIFICATE": options["certificate"],
                    "TLS_CERTIFICATE_KEY": options["certificate_key"],
                    "LOG_DIR": options["log_dir"],
                }
            ),
            ending="",
        )
