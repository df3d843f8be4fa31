"""System checks on settings: fail loudly, with ids and hints, before a bad deployment serves."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Tags, register

SECRET_KEY_HINT = (
    "Set DJANGO_SECRET_KEY (in the environment or in .env beside manage.py) to a long random value, "
    "e.g. the output of `python3 -c 'import secrets; print(secrets.token_urlsafe(50))'`; or, for "
    "development on the loopback only, DJANGO_DEBUG=true (as make run does)."
)


@register(Tags.security, deploy=True)
def check_secret_key(app_configs, **kwargs) -> list[Error]:
    """A deployment (``check --deploy``; a server start with debug off or reachable from other
    machines, ``completions_site/startup.py``) must not use the well-known default secret key."""
    if settings.SECRET_KEY == settings.DEFAULT_SECRET_KEY:
        return [
            Error(
                "DJANGO_SECRET_KEY is the default development key, which anyone can read in the source: "
                "sessions and password-reset links could be forged.",
                hint=SECRET_KEY_HINT,
                id="completions_site.E001",
            )
        ]
    return []


@register(Tags.security)
def check_debug_exposed(app_configs, **kwargs) -> list[Error]:
    """A daphne server that other machines reach must not run in debug mode, whose error pages show
    the code and the settings (``completions_site/serving.py``: silent outside daphne)."""
    from completions_site.serving import exposed

    endpoints = exposed()
    if settings.DEBUG and endpoints:
        return [
            Error(
                f"DJANGO_DEBUG is true while serving on {', '.join(endpoints)}, which other machines reach.",
                hint="Set DJANGO_DEBUG=false (make run turns debug on for a loopback HOST only), "
                "or bind 127.0.0.1 for a development server.",
                id="completions_site.E010",
            )
        ]
    return []


@register(Tags.compatibility)
def check_limit_settings(app_configs, **kwargs) -> list[Error]:
    """The limits' settings: a known fail mode, a Redis URL Redis understands, no negative limits."""
    errors = []
    if settings.API_LIMITS_FAIL_MODE not in ("open", "closed"):
        errors.append(
            Error(
                f"API_LIMITS_FAIL_MODE is {settings.API_LIMITS_FAIL_MODE!r}.",
                hint="Set it to 'open' (serve on, each process counting alone, while Redis is down) or 'closed' (503).",
                id="completions_site.E002",
            )
        )
    if settings.REDIS_URL and settings.REDIS_URL.partition("://")[0] not in ("redis", "rediss", "unix"):
        errors.append(
            Error(
                "REDIS_URL is not a Redis URL.",
                hint="Use redis://[:password@]host:port/db, rediss://... for TLS, or unix:///path/to/socket; "
                "leave it empty to count limits in each process.",
                id="completions_site.E003",
            )
        )
    for name in (
        "API_DEFAULT_RPM",
        "API_DEFAULT_TPM",
        "API_DEFAULT_MAX_CONCURRENT",
        "API_DEFAULT_MONTHLY_TOKENS",
        "API_LIMITS_REDIS_TIMEOUT",
        "API_LIMITS_REDIS_RETRY_SECONDS",
        "API_LIMITS_CONCURRENCY_LEASE_SECONDS",
    ):
        if getattr(settings, name) < 0:
            errors.append(
                Error(
                    f"{name} is negative.",
                    hint="A limit of 0 means none; times are in seconds.",
                    id="completions_site.E004",
                )
            )
    return errors


@register(Tags.compatibility)
def check_engine_settings(app_configs, **kwargs) -> list[Error]:
    """The engine's settings: a known model runner."""
    if settings.ENGINE_RUNNER in ("auto", "llama", "transformers"):  # inference.model_runner.RUNNERS, without torch
        return []
    return [
        Error(
            f"ENGINE_RUNNER is {settings.ENGINE_RUNNER!r}.",
            hint="Set it to 'auto' (our Llama runner when it supports the model, else transformers'), 'llama' or 'transformers'.",
            id="completions_site.E005",
        )
    ]


@register(Tags.compatibility)
def check_metrics_settings(app_configs, **kwargs) -> list[Error]:
    """``METRICS_ALLOWED_IPS``: addresses or networks that ``ipaddress`` reads (as ``/metrics`` reads them)."""
    from completions_site.metrics import allowed_networks

    errors = []
    for entry in settings.METRICS_ALLOWED_IPS:
        try:
            allowed_networks((entry,))
        except ValueError:
            errors.append(
                Error(
                    f"METRICS_ALLOWED_IPS has {entry!r}, which is neither an address nor a network.",
                    hint="List addresses or networks, comma-separated: 127.0.0.1,::1,10.0.0.0/8.",
                    id="completions_site.E006",
                )
            )
    return errors


@register(Tags.security)
def check_signin_settings(app_configs, **kwargs) -> list[Error]:
    """The sign-in lock-out's settings: a failure limit of 0 (no lock-out) or more, a lock of a minute or more."""
    if settings.SIGNIN_FAILURE_LIMIT >= 0 and settings.SIGNIN_LOCKOUT_MINUTES >= 1:
        return []
    return [
        Error(
            f"SIGNIN_FAILURE_LIMIT is {settings.SIGNIN_FAILURE_LIMIT} and SIGNIN_LOCKOUT_MINUTES "
            f"{settings.SIGNIN_LOCKOUT_MINUTES}.",
            hint="SIGNIN_FAILURE_LIMIT counts failed sign-ins before a lock (0: no lock-out); "
            "SIGNIN_LOCKOUT_MINUTES is how long a lock lasts, at least 1.",
            id="completions_site.E011",
        )
    ]


@register(Tags.compatibility)
def check_models_settings(app_configs, **kwargs) -> list[Error]:
    """``MODELS_CONFIG``: a TOML list of models that can be served (each table's keys, paths that
    exist, no name given twice: :mod:`inference.models_config`); ``MODELS_MEMORY_BUDGET``: a size.
    Whether the models fit in the budget is checked when a server starts (``startup.py``): that
    reads their files."""
    from api.engine import model_specs
    from inference.models_config import ModelsConfigError, parse_size

    errors = []
    if settings.MODELS_CONFIG:
        try:
            model_specs()
        except ModelsConfigError as error:
            errors.append(
                Error(
                    str(error),
                    hint='Each [[models]] table needs an "id" and a "path" (a GGUF file, a model folder or "embedded"); '
                    "see docs/configuration.md#several-models. Leave MODELS_CONFIG empty to serve MODEL_PATH alone.",
                    id="completions_site.E012",
                )
            )
    try:
        parse_size(settings.MODELS_MEMORY_BUDGET)
    except ValueError as error:
        errors.append(
            Error(
                f"MODELS_MEMORY_BUDGET: {error}.",
                hint="Write the memory the models may take together, e.g. 12GiB (binary) or 16GB (decimal); "
                "leave it empty for no budget.",
                id="completions_site.E013",
            )
        )
    return errors
