"""What a serving process does once, before it answers: run the checks, start the engine, and
(under daphne) handle SIGTERM by draining (``completions_site/shutdown.py``)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from completions_site import shutdown
from inference import memory


def start_server() -> None:
    """Refuse to serve on a failed system check; start loading the model unless disabled.

    Raises ``ImproperlyConfigured`` listing the failed checks (e.g. the default secret key with
    ``DJANGO_DEBUG=false``).
    """
    errors = [m for m in checks.run_checks(include_deployment_checks=False) if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("Refusing to start:\n" + "\n".join(str(e) for e in errors))
    memory.mmap_large_allocations()
    shutdown.install_when_served()  # under daphne: SIGTERM drains instead of cutting requests off
    if settings.ENGINE_AUTOSTART:
        from api.engine import get_engine

        get_engine().start()
