"""nginx from Debian's package in front of live servers, run as a foreground process by any user.

``deploy/nginx.conf`` (the site the deployment ships) is rendered into a temporary directory with
the servers' addresses and a self-signed certificate for its HTTPS port, and wrapped in a minimal main configuration whose pid file, temporary
paths and logs all lie in that directory, so no root and no ``/var`` is needed.  The e2e test of
the deployment (``tests/e2e/test_deployment.py``) and ``bench/soak.py`` use it.
"""

from __future__ import annotations

import os
import shutil
import string
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from testing.live_server import ROOT, free_port

SITE_TEMPLATE = ROOT / "deploy" / "nginx.conf"
NGINX_CANDIDATES = ("/usr/sbin/nginx", "/usr/bin/nginx")

MAIN_CONFIG = """\
{user}daemon off;
worker_processes 1;
pid {run}/nginx.pid;
error_log {run}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    log_format upstreams '$status $request_method $uri $upstream_addr $upstream_status';
    access_log {run}/access.log upstreams;
    client_body_temp_path {run}/client_body;
    proxy_temp_path {run}/proxy;
    fastcgi_temp_path {run}/fastcgi;
    uwsgi_temp_path {run}/uwsgi;
    scgi_temp_path {run}/scgi;
    include {run}/site.conf;
}}
"""


def nginx_binary() -> str | None:
    """The nginx executable, or ``None`` where it is not installed (``.ci/install-nginx``)."""
    found = shutil.which("nginx")
    if found:
        return found
    return next((path for path in NGINX_CANDIDATES if Path(path).exists()), None)


def self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for ``localhost`` and 127.0.0.1 and its key (``openssl``), valid for a day."""
    certificate, key = directory / "localhost.crt", directory / "localhost.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(certificate)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return certificate, key


def render_site(
    upstreams: list[str], listen: str, max_body_bytes: int, listen_tls: str, certificate: Path, key: Path
) -> str:
    """``deploy/nginx.conf`` with its placeholders filled in (nginx's own ``$variables`` stay)."""
    values = {
        "COMPLETIONS_LISTEN": listen,
        "COMPLETIONS_LISTEN_TLS": listen_tls,
        "COMPLETIONS_TLS_CERTIFICATE": str(certificate),
        "COMPLETIONS_TLS_CERTIFICATE_KEY": str(key),
        "COMPLETIONS_UPSTREAMS": " ".join(f"server {address};" for address in upstreams),
        "API_MAX_BODY_BYTES": str(max_body_bytes),
    }
    lines = SITE_TEMPLATE.read_text().splitlines(keepends=True)  # comments stay as written
    return "".join(
        line if line.lstrip().startswith("#") else string.Template(line).safe_substitute(values) for line in lines
    )


@dataclass
class Nginx:
    """A running nginx: its plain ``base_url``, its ``tls_url`` (a self-signed certificate), process
    and run directory (with ``access.log``)."""

    base_url: str
    process: subprocess.Popen
    run_dir: Path
    tls_url: str = ""

    def stop(self) -> None:
        self.process.terminate()  # SIGTERM: nginx's fast shutdown
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()

    def upstreams(self) -> list[tuple[int, str, str, str]]:
        """``(status, method, path, upstream address)`` per request so far, from the access log
        (the address is ``-`` where nginx answered itself)."""
        log = self.run_dir / "access.log"
        rows = [line.split() for line in log.read_text().splitlines()] if log.exists() else []
        return [(int(row[0]), row[1], row[2], row[3]) for row in rows if len(row) >= 4]

    def logged_after(self, start: int, count: int, timeout: float = 10.0) -> list[tuple[int, str, str, str]]:
        """The access log's rows from row ``start`` on, once there are ``count`` of them.

        nginx writes a request's line when it finalizes the request, which can come after the client
        has its answer (a refused body is read and discarded first), so a test waits for the lines.
        Raises ``TimeoutError`` after ``timeout`` seconds with fewer rows.
        """
        deadline = time.monotonic() + timeout
        while len(rows := self.upstreams()[start:]) < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nginx logged {len(rows)} of {count} requests: {rows}")
            time.sleep(0.05)
        return rows

    def log(self) -> str:
        return "\n".join(
            (self.run_dir / name).read_text() for name in ("error.log", "access.log") if (self.run_dir / name).exists()
        )


def start_nginx(run_dir: Path, upstreams: list[str], max_body_bytes: int) -> Nginx:
    """Render the configuration into ``run_dir``, check it (``nginx -t``) and start nginx on two free
    ports, plain HTTP and HTTPS."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed (.ci/install-nginx)")
    run_dir.mkdir(parents=True, exist_ok=True)
    port, tls_port = free_port(), free_port()
    certificate, key = self_signed_certificate(run_dir)
    site = render_site(upstreams, f"127.0.0.1:{port}", max_body_bytes, f"127.0.0.1:{tls_port}", certificate, key)
    (run_dir / "site.conf").write_text(site)
    config = run_dir / "nginx.conf"
    # Run as root, nginx's workers would switch to "nobody", who cannot write request bodies into
    # the temporary paths in run_dir (a 0700 directory of root's): they stay root's here.
    user = "user root;\n" if os.geteuid() == 0 else ""
    config.write_text(MAIN_CONFIG.format(run=run_dir, user=user))
    command = [binary, "-p", str(run_dir), "-c", str(config), "-e", str(run_dir / "error.log")]
    check = subprocess.run([*command, "-t"], capture_output=True, text=True, timeout=30)
    if check.returncode != 0:
        raise RuntimeError(f"nginx -t failed:\n{check.stderr}")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    nginx = Nginx(f"http://127.0.0.1:{port}", process, run_dir, f"https://127.0.0.1:{tls_port}")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nginx exited with {process.returncode}:\n{nginx.log()}")
        try:
            httpx.get(nginx.base_url + "/healthz", timeout=2)
            return nginx
        except httpx.HTTPError:
            time.sleep(0.1)
    nginx.stop()
    raise RuntimeError(f"nginx did not answer:\n{nginx.log()}")
