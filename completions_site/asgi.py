"""The ASGI entry point served by daphne: ``daphne completions_site.asgi:application``.

Starting the server also starts the engine's worker thread, which loads the model in the
background (``/healthz`` answers 503 until it is ready).  The system checks run first, so a
production start with the default secret key refuses to serve.
"""
import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "completions_site.settings")

from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

# The admin's CSS and JavaScript come from the apps' static folders through Django's own handler,
# so a fresh checkout needs no collectstatic and no separate file server.
application = ASGIStaticFilesHandler(get_asgi_application())

from completions_site.startup import start_server  # noqa: E402

start_server()
