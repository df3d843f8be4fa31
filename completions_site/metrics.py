"""``GET /metrics``: the engine's, the limiter's and the gateway's metrics in Prometheus's text format.

Not for the public: it answers a client whose address is in ``METRICS_ALLOWED_IPS`` (addresses or
networks, default the loopback ones) or that sends ``Authorization: Bearer <METRICS_TOKEN>`` (when
that is set); anyone else gets the site's 404, as if the path did not exist.  Behind a proxy the
address is the proxy's unless daphne runs with ``--proxy-headers`` (the first ``X-Forwarded-For``
entry): then the proxy must replace that header, not append to it, or a client names its own
address; ``deploy/nginx.conf`` replaces it and refuses ``/metrics`` itself.

With ``PROMETHEUS_MULTIPROC_DIR`` set (before the processes start; an empty folder shared by every
daphne process of the machine, emptied at each deployment) the answer adds up every process's
values (prometheus_client's multiprocess mode); without it, it is this process's alone.

The metric objects: :mod:`inference.metrics` (engine), :mod:`keys.metrics` (limits),
:mod:`api.metrics` (HTTP).  Their names and meanings are listed in docs/operations.md.
"""

from __future__ import annotations

import atexit
import hmac
import ipaddress
import os
from functools import cache
from pathlib import Path

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.views.decorators.csrf import csrf_exempt
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess

import api.metrics  # noqa: F401 - registers the gateway's metrics
import inference.metrics  # noqa: F401 - registers the engine's metrics
import keys.metrics  # noqa: F401 - registers the limiter's metrics


@csrf_exempt  # no cookie authenticates it: another method is a plain 405, not the CSRF page
def metrics(request: HttpRequest) -> HttpResponse:
    """The metrics, or 404 for a client neither allowed by address nor holding the token, or an
    empty 405 for an allowed client's method other than GET and HEAD."""
    if not allowed(request):
        raise Http404
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    return HttpResponse(generate_latest(_registry()), content_type=CONTENT_TYPE_LATEST)


def allowed(request: HttpRequest) -> bool:
    """Whether the client's address is in ``METRICS_ALLOWED_IPS`` or it sends the bearer ``METRICS_TOKEN``."""
    token = settings.METRICS_TOKEN
    scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
    if token and scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), token.encode()):
        return True
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR") or "")
    except ValueError:
        return False
    return any(address in network for network in allowed_networks(tuple(settings.METRICS_ALLOWED_IPS)))


@cache
def allowed_networks(entries: tuple[str, ...]) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """``METRICS_ALLOWED_IPS`` as networks (an address is a network of one); raises ``ValueError`` on a bad entry."""
    return tuple(ipaddress.ip_network(entry.strip(), strict=False) for entry in entries if entry.strip())


def forget_live_gauges_at_exit() -> None:
    """In multiprocess mode, drop this process's live gauges when it exits normally, and those of
    processes that did not (crashed or killed) when it starts.

    ``livesum`` gauges (requests running and waiting, KV cache columns) add up the files of
    processes not yet marked dead; without this, a stopped process's last values would stay in
    the sums until the folder is emptied.  Counters and histograms keep its values, as they must.
    A process killed with SIGKILL cannot clean up after itself: its successor (systemd's
    ``Restart=on-failure``, or the next deployment) does, at its start.
    """
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        forget_dead_processes(os.environ["PROMETHEUS_MULTIPROC_DIR"])
        atexit.register(multiprocess.mark_process_dead, os.getpid())


def forget_dead_processes(directory: str) -> list[int]:
    """Mark dead every process with live-gauge files in ``directory`` that no longer runs; returns their pids."""
    dead = []
    for path in Path(directory).glob("gauge_live*_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1]) if path.stem.rsplit("_", 1)[1].isdigit() else None
        if pid is None or pid in dead or _running(pid):
            continue
        multiprocess.mark_process_dead(pid, directory)
        dead.append(pid)
    return dead


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: running
        return True
    return True


def _registry() -> CollectorRegistry:
    if "PROMETHEUS_MULTIPROC_DIR" in os.environ:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY
