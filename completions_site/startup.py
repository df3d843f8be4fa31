"""What a serving process does once, before it answers: run the checks, open the usage journal
(replaying what an earlier process left), start the engine, and (under daphne) handle SIGTERM by
draining (``completions_site/shutdown.py``)."""

from __future__ import annotations

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from completions_site import shutdown
from inference import memory
from keys.journal import get_journal


def start_server() -> None:
    """Refuse to serve on a failed system check; open the usage journal and start its flusher;
    start loading the model unless disabled.

    Raises ``ImproperlyConfigured`` listing the failed checks (e.g. the default secret key with
    ``DJANGO_DEBUG=false``), ``RuntimeError`` when another live process holds this process's
    journal (one ``USAGE_JOURNAL_ID`` for two processes).
    """
    errors = [m for m in checks.run_checks(include_deployment_checks=False) if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("Refusing to start:\n" + "\n".join(str(e) for e in errors))
    get_journal().start_flusher()  # writes what an earlier process left, then whatever waits
    memory.mmap_large_allocations()
    shutdown.install_when_served()  # under daphne: SIGTERM drains instead of cutting requests off
    if settings.ENGINE_AUTOSTART:
        from api.engine import get_engine

        get_engine().start()
