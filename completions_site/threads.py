"""The process's OpenMP wait policy, set before torch (and with it libgomp) is first imported.

torch runs its matrix products on libgomp's worker threads, one per core, and by default a worker
that has finished its share spins for about 300,000 iterations before it sleeps.  Alone on a machine
that saves a wake-up per operation; with a second server process on the same cores, or any other busy
program, the spinning threads take the CPU from the threads that have work, and generation all but
stops (docs/performance.md#threads-and-busy-neighbours).  libgomp reads its environment once, when it
is loaded, so the policy has to be in ``os.environ`` before ``import torch``:
``completions_site/asgi.py`` and ``manage.py`` call :func:`apply_thread_policy` first thing.

An operator's own choice wins: when ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set (even to
libgomp's default), nothing is changed.  ``bench/thread_policy.py`` measures the alternatives.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

# What a process gets when the operator has set neither variable (see bench/thread_policy.py and
# docs/performance.md, "Threads and busy neighbours", for the measurements behind it).
DEFAULT_POLICY = {"OMP_WAIT_POLICY": "PASSIVE"}
OPERATOR_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def apply_thread_policy(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Put :data:`DEFAULT_POLICY` in ``environ`` unless the operator set a wait policy; returns what it set."""
    if any(name in environ for name in OPERATOR_VARIABLES):
        return {}
    environ.update(DEFAULT_POLICY)
    return dict(DEFAULT_POLICY)
