"""Which addresses a daphne command line binds, and which of them other machines reach
(``completions_site/serving.py``, read by the checks that refuse an exposed debug start)."""

from __future__ import annotations

import pytest

from completions_site.serving import daphne_endpoints, exposed_endpoints, is_loopback

APP = "completions_site.asgi:application"


@pytest.mark.parametrize(
    ("arguments", "endpoints"),
    [
        ([APP], ["tcp:port=8000:interface=127.0.0.1"]),  # daphne's defaults
        (["-b", "0.0.0.0", "-p", "9000", APP], ["tcp:port=9000:interface=0.0.0.0"]),
        (["-b", "::1", APP], [r"tcp:port=8000:interface=\:\:1"]),
        (["-p", "8001", APP], ["tcp:port=8001:interface=127.0.0.1"]),
        (["-u", "/run/completions-site/8001.sock", APP], ["unix:/run/completions-site/8001.sock"]),
        (["--proxy-headers", "-e", "tcp:8002", APP], ["tcp:8002"]),
    ],
)
def test_the_endpoints_are_the_ones_daphne_will_listen_on(arguments, endpoints):
    assert daphne_endpoints(["/srv/.venv/bin/daphne", *arguments]) == endpoints


def test_python_dash_m_daphne_is_daphne_too():
    argv = ["/usr/lib/python3/site-packages/daphne/__main__.py", "-b", "0.0.0.0", APP]

    assert daphne_endpoints(argv) == ["tcp:port=8000:interface=0.0.0.0"]


@pytest.mark.parametrize(
    "argv", [["manage.py", "runserver"], ["/usr/bin/pytest", "-q"], ["daphne", "--no-such-option", APP], []]
)
def test_anything_but_a_daphne_command_line_binds_nothing(argv):
    assert daphne_endpoints(argv) is None


@pytest.mark.parametrize(
    ("endpoint", "reachable"),
    [
        ("tcp:port=8000:interface=127.0.0.1", False),
        ("tcp:port=8000:interface=127.0.0.2", False),
        (r"tcp:port=8000:interface=\:\:1", False),
        ("tcp:port=8000:interface=localhost", False),
        ("unix:/run/completions-site/8001.sock", False),
        ("tcp:port=8000:interface=0.0.0.0", True),
        (r"tcp:port=8000:interface=\:\:", True),
        ("tcp:port=8000:interface=192.168.1.20", True),
        ("tcp:port=8000:interface=api.example.org", True),
        ("tcp:8000", True),  # every interface
        ("fd:fileno=3", True),  # unknown: counted as reachable
        ("tcp:8000:interface=127.0.0.1:interface=0.0.0.0", True),  # Twisted binds the last one
    ],
)
def test_only_loopback_interfaces_and_unix_sockets_are_unreachable_from_other_machines(endpoint, reachable):
    assert exposed_endpoints([endpoint]) == ([endpoint] if reachable else [])


@pytest.mark.parametrize(("host", "loopback"), [("[::1]", True), ("LOCALHOST", True), ("", False), ("10.0.0.1", False)])
def test_loopback_hosts(host, loopback):
    assert is_loopback(host) is loopback
