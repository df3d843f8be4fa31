"""The process-level OpenMP wait policy (completions_site/threads.py): set before torch is imported,
and an operator's own settings left alone.  What it costs or saves is measured by
bench/thread_policy.py, not here."""

import ast
from pathlib import Path

import pytest

from completions_site.threads import DEFAULT_POLICY, apply_thread_policy

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_policy_is_set_when_the_operator_set_none():
    environ = {"PATH": "/bin"}
    assert apply_thread_policy(environ) == DEFAULT_POLICY
    assert environ == {"PATH": "/bin", **DEFAULT_POLICY}


@pytest.mark.parametrize(
    "variable, value",
    [
        ("OMP_WAIT_POLICY", "ACTIVE"),
        ("OMP_WAIT_POLICY", "passive"),
        ("GOMP_SPINCOUNT", "300000"),
        ("GOMP_SPINCOUNT", ""),
    ],
)
def test_an_operator_setting_wins(variable, value):
    environ = {variable: value}
    assert apply_thread_policy(environ) == {}
    assert environ == {variable: value}


@pytest.mark.parametrize("path", ["completions_site/asgi.py", "manage.py"])
def test_the_policy_comes_before_any_import_that_could_load_torch(path):
    """libgomp reads its environment once, when torch loads it: the call must precede Django and the app."""
    source = (ROOT / path).read_text()
    calls = [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "apply_thread_policy"
    ]
    assert calls, f"{path} does not call apply_thread_policy()"
    imports = [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom | ast.Import)
        and not any(alias.name in ("os", "sys", "apply_thread_policy") for alias in node.names)
    ]
    assert all(calls[0] < line for line in imports), f"{path}: an import comes before apply_thread_policy()"
