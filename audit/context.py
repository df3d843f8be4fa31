"""Who is acting: the actor an audit entry names, held in a context variable.

The model signals that record events (``audit.receivers``) cannot see the request, so the actor
travels beside it:

- :class:`audit.middleware.AuditActorMiddleware` sets, for each request, an actor that is worked
  out when an event needs it (so a login or sign-up during the request is seen): the object in
  ``request.audit_actor`` if a view set one; else ``request.auth`` when an authentication class
  put a credential there (DRF copies ``request.auth`` onto Django's request), as an ``api_key``
  actor; else the signed-in ``request.user`` as a ``session`` actor; else an anonymous session
  with the client's IP.
- ``with acting_as(actor): ...`` names the actor explicitly for the code inside (an API view
  acting for an admin key, a script); it wins over the middleware's.
- With neither (``manage.py`` commands, the shell), the actor is ``system`` (our extension to the
  spec's ``session``/``api_key``), with the command's name when run from ``manage.py``.

An actor is the spec's ``AuditLogActor``::

    {"type": "session", "session": {"user": {"id": "user_3", "email": "a@b.c"}, "ip_address": "10.0.0.1"}}
    {"type": "session", "session": {"ip_address": "10.0.0.1"}}  (nobody signed in: a sign-up, a failed login)
    {"type": "api_key", "api_key": {"id": "key_AbCd1234", "type": "user", "user": {"id": ..., "email": ...}}}
    {"type": "system", "system": {"id": "manage.py create_api_key"}}
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from keys.ids import api_key_id, user_id

if TYPE_CHECKING:  # the models load with the apps; this module is imported before (api/handlers.py, asgi.py)
    from django.contrib.auth.base_user import AbstractBaseUser
    from django.http import HttpRequest

SESSION = "session"
API_KEY = "api_key"
SYSTEM = "system"


@dataclass(frozen=True)
class Actor:
    """Who acted: ``type`` (``session``, ``api_key`` or ``system``) and ``id`` (the user's id for a
    session, the admin key's id, or the system's name), the user behind it and the client's IP."""

    type: str
    id: str = ""
    user_id: str | None = None
    email: str | None = None
    ip_address: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The spec's ``AuditLogActor`` (``system`` is ours); what is unknown (no user signed in,
        no e-mail, no IP) is left out rather than ``null``, as the spec's strings allow no null."""
        user = _present({"id": self.user_id, "email": self.email}) if self.user_id else None
        if self.type == SESSION:
            return {"type": SESSION, "session": _present({"user": user, "ip_address": self.ip_address})}
        if self.type == API_KEY:
            return {"type": API_KEY, "api_key": _present({"id": self.id, "type": "user", "user": user})}
        return {"type": SYSTEM, "system": {"id": self.id}}


def _present(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}


_current: contextvars.ContextVar[Actor | Callable[[], Actor] | None] = contextvars.ContextVar(
    "audit_actor", default=None
)


def user_actor(user: AbstractBaseUser, ip_address: str | None = None) -> Actor:
    """A ``session`` actor for a signed-in person."""
    return Actor(SESSION, user_id(user.pk), user_id(user.pk), getattr(user, "email", "") or None, ip_address)


def actor_for(thing: Any, ip_address: str | None = None) -> Actor:
    """The actor for ``thing``: an :class:`Actor` as it is, a user as a ``session``, anything else
    (an admin key) as an ``api_key`` actor.

    An admin key is read by duck typing, so any model fits: ``audit_actor()`` if it has one
    (returning an :class:`Actor`); else its id is ``public_id``, else ``key_{prefix}``, else its
    ``pk``; its person is ``owner``, ``user`` or ``created_by``, whichever it has.
    """
    if isinstance(thing, Actor):
        return thing
    from django.contrib.auth.base_user import AbstractBaseUser

    if isinstance(thing, AbstractBaseUser):
        return user_actor(thing, ip_address)
    if callable(getattr(thing, "audit_actor", None)):
        return thing.audit_actor()
    public_id = getattr(thing, "public_id", None)
    if not public_id and getattr(thing, "prefix", None):
        public_id = api_key_id(thing.prefix)
    person = next(
        (getattr(thing, name) for name in ("owner", "user", "created_by") if getattr(thing, name, None)), None
    )
    return Actor(
        API_KEY,
        str(public_id or getattr(thing, "pk", "")),
        user_id(person.pk) if person is not None else None,
        (getattr(person, "email", "") or None) if person is not None else None,
        ip_address,
    )


def request_actor(request: HttpRequest) -> Actor:
    """The actor of ``request`` (a Django or a DRF request), by the rules in the module docstring."""
    request = getattr(request, "_request", request)  # DRF's Request wraps Django's
    ip_address = client_ip(request)
    explicit = request.__dict__.get("audit_actor")
    if explicit is not None:
        return actor_for(explicit, ip_address)
    credential = request.__dict__.get("auth")
    if credential is not None:
        return actor_for(credential, ip_address)
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return user_actor(user, ip_address)
    return Actor(SESSION, ip_address=ip_address)


def set_request_actor(request: Any, actor: Any) -> None:
    """Name ``actor`` (an admin key, a user or an :class:`Actor`) as who acts for the rest of
    ``request``, a Django or a DRF request; the middleware's actor reads it."""
    getattr(request, "_request", request).audit_actor = actor


def client_ip(request: HttpRequest | None) -> str | None:
    """``REMOTE_ADDR`` (what daphne saw; a proxy's ``X-Forwarded-For`` is not trusted here)."""
    return request.META.get("REMOTE_ADDR") if request is not None else None


@contextmanager
def acting_as(actor: Any) -> Iterator[Actor]:
    """Record the events inside the block as done by ``actor`` (see :func:`actor_for`)."""
    resolved = actor_for(actor)
    token = _current.set(resolved)
    try:
        yield resolved
    finally:
        _current.reset(token)


@contextmanager
def acting_for_request(request: HttpRequest) -> Iterator[None]:
    """The middleware's part: the request's actor, worked out only when an event needs it."""
    token = _current.set(lambda: request_actor(request))
    try:
        yield
    finally:
        _current.reset(token)


def current_actor() -> Actor:
    """Who is acting now: :func:`acting_as`'s actor, the request's, or ``system``."""
    value = _current.get()
    if value is None:
        return system_actor()
    return value() if callable(value) else value


def system_actor() -> Actor:
    """``system``, named ``manage.py <command>`` when a ``manage.py``/``django-admin`` command runs."""
    program = Path(sys.argv[0]).name if sys.argv else ""
    if program in ("manage.py", "django-admin") and len(sys.argv) > 1:
        return Actor(SYSTEM, f"manage.py {sys.argv[1]}")
    return Actor(SYSTEM, "system")
