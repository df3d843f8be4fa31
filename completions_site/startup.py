"""What a serving process does once, before it answers: run the checks, start the engine."""
from __future__ import annotations

import ctypes
import sys

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured


def start_server() -> None:
    """Refuse to serve on a failed system check; start loading the model unless disabled.

    Raises ``ImproperlyConfigured`` listing the failed checks (e.g. the default secret key with
    ``DJANGO_DEBUG=false``).
    """
    errors = [m for m in checks.run_checks(include_deployment_checks=False) if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("Refusing to start:\n" + "\n".join(str(e) for e in errors))
    _return_freed_memory()
    if settings.ENGINE_AUTOSTART:
        from inference.engine import get_engine

        get_engine().start()


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)


def _return_freed_memory() -> None:
    """Make glibc serve allocations of 1 MiB and more with mmap, so freed KV-cache buffers go back
    to the system.  By default glibc raises that threshold after the first large free, and the
    batch's reallocated buffers then stay in the heap as unreturned memory (RSS creeps upwards)."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, 1 << 20)
    except (OSError, AttributeError):  # not glibc (musl, ...): nothing to tune
        pass
