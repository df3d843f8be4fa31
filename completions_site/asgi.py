"""The ASGI entry point served by daphne: ``daphne completions_site.asgi:application``.

HTTP goes to Django: ``/v1/...`` and ``/healthz`` through a handler without the browser
middleware, every other path (the admin, the dashboard, static files) through the full one;
WebSockets go to the channels routes of ``dashboard/routing.py``.

Starting the server also starts each model's engine, whose worker thread loads its model in the
background (``/healthz`` answers 503 until every one is ready), once the models are known to fit
in ``MODELS_MEMORY_BUDGET``.  The system checks run first, so a
production start with the default secret key, or one that other machines reach in debug mode,
refuses to serve: the process exits with the checks' messages, which say what to set.

The OpenMP wait policy is set first of all (``completions_site/threads.py``): torch's threads must
not spin while another process needs the cores.
"""

import os

from completions_site.threads import apply_thread_policy

apply_thread_policy()  # before anything imports torch: libgomp reads it once, when it is loaded
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "completions_site.settings")

import django  # noqa: E402 - after the thread policy, before torch
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from api.access import AccessLog  # noqa: E402
from api.handlers import APIHandler, LanedHandler, route  # noqa: E402
from completions_site.http_status import add_reason_phrases  # noqa: E402
from completions_site.logs import route_daphne_access_log  # noqa: E402

add_reason_phrases()  # "429 Too Many Requests", not twisted's "Unknown Status"
route_daphne_access_log()  # daphne's access lines through logging, where secrets are redacted

# The admin's CSS and JavaScript come from the apps' static folders through Django's own handler,
# so a fresh checkout needs no collectstatic and no separate file server.  The API's paths skip
# the browser middleware (api/handlers.py).
django.setup(set_prefix=False)  # as get_asgi_application() does before it makes its handler
site_application = ASGIStaticFilesHandler(LanedHandler())
# One access-log line, one x-request-id and the gateway's metrics per request (api/access.py).
http_application = AccessLog(route(APIHandler(), site_application))

# --- WebSockets (the dashboard app): the staff dashboard's live engine figures, through channels.
# Session auth gives the consumer its user; the origin must be one of ALLOWED_HOSTS.
from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from django.urls import re_path  # noqa: E402

from completions_site.websocket import refuse  # noqa: E402
from dashboard.routing import websocket_urlpatterns  # noqa: E402

# Any other WebSocket path is refused quietly (a 403 to the handshake), not a 500 traceback.
application = ProtocolTypeRouter(
    {
        "http": http_application,
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter([*websocket_urlpatterns, re_path(r"", refuse)]))
        ),
    }
)

import sys  # noqa: E402

from django.core.exceptions import ImproperlyConfigured  # noqa: E402

from completions_site.metrics import forget_live_gauges_at_exit  # noqa: E402
from completions_site.startup import start_server  # noqa: E402

forget_live_gauges_at_exit()
try:
    start_server()
except ImproperlyConfigured as refusal:
    sys.exit(str(refusal))  # the message alone, not a traceback through daphne's import
