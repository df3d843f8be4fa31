"""What a serving process does once, before it answers: run the checks, check that its models fit
in ``MODELS_MEMORY_BUDGET``, open the usage journal (replaying what an earlier process left), start
each model's engine, and (under daphne) handle SIGTERM by draining (``completions_site/shutdown.py``)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from completions_site import shutdown
from completions_site.serving import exposed
from inference import memory
from keys.journal import get_journal

logger = logging.getLogger(__name__)


def start_server() -> None:
    """Refuse to serve on a failed system check (:func:`check_before_serving`) or models that do
    not fit in ``MODELS_MEMORY_BUDGET`` (:func:`check_models_fit`); open the usage journal and
    start its flusher; start loading every model unless disabled.

    Raises ``ImproperlyConfigured`` as those two do, ``RuntimeError`` when another live process
    holds this process's journal (one ``USAGE_JOURNAL_ID`` for two processes).
    """
    check_before_serving()
    if settings.ENGINE_AUTOSTART:
        check_models_fit()
    get_journal().start_flusher()  # writes what an earlier process left, then whatever waits
    memory.tune_allocator()
    shutdown.install_when_served()  # under daphne: SIGTERM drains instead of cutting requests off
    if settings.ENGINE_AUTOSTART:
        from api.engine import get_models

        get_models().start()


def check_models_fit() -> None:
    """Refuse to start models that together pass ``MODELS_MEMORY_BUDGET`` (estimated from their
    files: :mod:`inference.footprint`); log each one's estimate when there is a budget.

    Raises ``ImproperlyConfigured`` naming the budget and the first model that does not fit, or a
    model file that cannot be read."""
    from api.engine import check_memory_budget

    try:
        estimates = check_memory_budget()
    except ValueError as error:  # MemoryBudgetExceeded, or a model file the estimate cannot read
        raise ImproperlyConfigured(f"Refusing to start: {error}") from None
    for estimate in estimates:
        logger.info("Memory: %s", estimate.describe())


def check_before_serving() -> None:
    """Run the system checks, and Django's deployment checks (``check --deploy``) too for a
    production start (debug off) or one that other machines reach; log the warnings (no HSTS,
    cookies without ``Secure``).

    Raises ``ImproperlyConfigured`` listing the errors, each with its hint: e.g. the default secret
    key (``completions_site.E001``), debug on a non-loopback bind (``completions_site.E010``).
    """
    deployment = not settings.DEBUG or bool(exposed())
    messages = [m for m in checks.run_checks(include_deployment_checks=deployment) if not m.is_silenced()]
    errors = [m for m in messages if m.is_serious()]
    if errors:
        raise ImproperlyConfigured("Refusing to start:\n" + "\n".join(str(e) for e in errors))
    for warning in messages:
        logger.warning("%s", warning)
