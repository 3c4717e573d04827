"""Debian's nginx in front of a test's gunicorn, with the deploy's own configuration
(``deploy/nginx/ankusa.conf``, rendered by ``manage.py nginx_conf``'s ``render``) on free loopback
ports, a self-signed certificate and everything else in the test's folder; run in the foreground
(``daemon off``) and stopped after."""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import time

from ankusa_site.management.commands.nginx_conf import render
from tests.servers import free_port
from tests.services import require_service

MAIN = """\
{user}
daemon off;
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log info;
events {{ worker_connections 1024; }}
http {{
    default_type application/octet-stream;
    client_body_temp_path {folder}/body;
    proxy_temp_path {folder}/proxy;
    fastcgi_temp_path {folder}/fastcgi;
    uwsgi_temp_path {folder}/uwsgi;
    scgi_temp_path {folder}/scgi;
    include {folder}/ankusa.conf;
}}
"""


def client_context() -> ssl.SSLContext:
    """TLS that takes the test's self-signed certificate."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Nginx:
    def __init__(self, upstream_port: int, folder, *, server_name: str = "127.0.0.1"):
        binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
        if binary is None:
            require_service("nginx", "Debian's nginx is not installed (apt-get install nginx)")
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        certificate, key = folder / "cert.pem", folder / "key.pem"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", f"/CN={server_name}", "-keyout", str(key), "-out", str(certificate)],
            check=True, capture_output=True,
        )  # fmt: skip
        self.http_port, self.https_port = free_port(), free_port()
        site = render(
            {
                "SERVER_NAME": server_name,
                "UPSTREAM": f"127.0.0.1:{upstream_port}",
                "HTTP_LISTEN": f"127.0.0.1:{self.http_port}",
                "HTTPS_LISTEN": f"127.0.0.1:{self.https_port}",
                "TLS_CERTIFICATE": str(certificate),
                "TLS_CERTIFICATE_KEY": str(key),
                "LOG_DIR": str(folder),
            }
        )
        (folder / "ankusa.conf").write_text(site)
        # As root (CI's containers), the workers would otherwise run as nobody, who cannot write here.
        user = "user root;" if os.geteuid() == 0 else ""
        (folder / "nginx.conf").write_text(MAIN.format(folder=folder, user=user))
        self.log = open(folder / "nginx.out", "wb")
        self.process = subprocess.Popen(
            [binary, "-p", str(folder), "-c", str(folder / "nginx.conf"), "-e", str(folder / "error.log")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 15
        while not self._accepting():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"nginx did not start: see {folder / 'error.log'}")
            time.sleep(0.05)

    def _accepting(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.https_port), timeout=1).close()
            return True
        except OSError:
            return False

    def access_log(self) -> str:
        return (self.folder / "ankusa.access.log").read_text()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # SIGTERM: nginx's fast shutdown
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
