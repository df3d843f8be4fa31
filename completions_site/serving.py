"""Where this process serves: the addresses daphne binds, read from its command line.

The server's safety depends on who can reach it: Django's debug mode and the well-known
development secret key are for a server only this machine reaches (``make run`` on 127.0.0.1).
daphne imports the application before it listens, so the system checks that refuse an exposed
start (``completions_site/checks.py``) read the bind from ``sys.argv`` with daphne's own parser.
Outside daphne (``manage.py``, the tests) there is no bind and those checks stay silent.
"""

from __future__ import annotations

import ipaddress
import re
import sys
from collections.abc import Sequence
from pathlib import Path

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def daphne_endpoints(argv: Sequence[str] | None = None) -> list[str] | None:
    """The Twisted endpoint descriptions (``tcp:port=8000:interface=0.0.0.0``, ``unix:/run/x.sock``)
    that the daphne command line ``argv`` (default ``sys.argv``) listens on, with daphne's defaults;
    ``None`` when ``argv`` is not daphne's (``manage.py``, pytest) or does not parse."""
    argv = list(sys.argv if argv is None else argv)
    if not argv or not _is_daphne(argv[0]):
        return None
    from daphne.cli import DEFAULT_HOST, DEFAULT_PORT, CommandLineInterface
    from daphne.endpoints import build_endpoint_description_strings

    try:
        args = CommandLineInterface().parser.parse_args(argv[1:])
    except SystemExit:  # argparse refused the line: daphne will say why itself
        return None
    host, port = args.host, args.port
    # The same defaults as daphne's CommandLineInterface.run, which applies them after the import.
    if not any([host, port is not None, args.unix_socket, args.file_descriptor is not None, args.socket_strings]):
        host, port = DEFAULT_HOST, DEFAULT_PORT
    elif host and port is None:
        port = DEFAULT_PORT
    elif port is not None and not host:
        host = DEFAULT_HOST
    endpoints = build_endpoint_description_strings(
        host=host, port=port, unix_socket=args.unix_socket, file_descriptor=args.file_descriptor
    )
    return sorted(args.socket_strings + endpoints)


def _is_daphne(program: str) -> bool:
    """``daphne`` (the console script) or ``python -m daphne`` (``.../daphne/__main__.py``)."""
    path = Path(program)
    return path.name == "daphne" or (path.name == "__main__.py" and path.parent.name == "daphne")


def exposed_endpoints(endpoints: Sequence[str]) -> list[str]:
    """Those of ``endpoints`` that another machine may reach: every one but a loopback interface or
    a UNIX socket (an inherited file descriptor or an interface by host name counts as reachable)."""
    return [endpoint for endpoint in endpoints if not _local(endpoint)]


def _local(endpoint: str) -> bool:
    kind, _, rest = endpoint.partition(":")
    if kind == "unix":
        return True
    if kind not in ("tcp", "tcp6", "ssl"):
        return False
    # Twisted's description: colon-separated, "\:" inside a value (an IPv6 interface).
    fields = [part.replace("\\:", ":") for part in re.split(r"(?<!\\):", rest)]
    # The last interface= wins, as Twisted's parser keeps the last value of a repeated key.
    interface = [field.partition("=")[2] for field in fields if field.startswith("interface=")][-1:] or [""]
    return is_loopback(interface[0])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address, ``[::1]``, or ``localhost``) is this machine's loopback; an
    empty host (every interface) is not."""
    host = host.strip().strip("[]")
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def exposed() -> list[str]:
    """The endpoints of this daphne process that other machines may reach (empty outside daphne)."""
    return exposed_endpoints(daphne_endpoints() or [])


def serving() -> bool:
    """Whether this process is a daphne server (rather than ``manage.py`` or a test)."""
    return daphne_endpoints() is not None
