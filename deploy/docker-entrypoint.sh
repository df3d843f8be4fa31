#!/bin/sh
# The image's command: migrate the database (unless MIGRATE_ON_START=false: compose's replicas
# leave it to "prepare"), then serve on 0.0.0.0:8000.  daphne believes X-Forwarded-For and
# X-Forwarded-Proto only with DAPHNE_PROXY_HEADERS=true: behind a proxy that replaces them on
# every request (deploy/nginx.conf), never on a port that clients reach directly, where a client
# could claim any address (the /metrics allow-list, the audit log's addresses).
set -eu
if [ "${MIGRATE_ON_START:-true}" = "true" ]; then
    python manage.py migrate --noinput
fi
set -- daphne -b 0.0.0.0 -p "${PORT:-8000}"
if [ "${DAPHNE_PROXY_HEADERS:-false}" = "true" ]; then
    set -- "$@" --proxy-headers
fi
exec "$@" completions_site.asgi:application
