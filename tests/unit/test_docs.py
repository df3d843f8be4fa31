"""The README and docs/ stay true to the tree: their links resolve and the configuration page
lists exactly the settings that ``completions_site/settings.py`` reads from the environment."""

from __future__ import annotations

import ast

import pytest

from testing.markdown import ROOT, Link, broken, doc_files, github_anchor, relative_links, table_names

SETTINGS = ROOT / "completions_site" / "settings.py"
CONFIGURATION = ROOT / "docs" / "configuration.md"


def environment_settings() -> set[str]:
    """The names settings.py passes to django-environ: ``env("NAME")`` and ``env.<cast>("NAME")``."""
    names = set()
    for node in ast.walk(ast.parse(SETTINGS.read_text())):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        function = node.func
        reads_env = (isinstance(function, ast.Name) and function.id == "env") or (
            isinstance(function, ast.Attribute) and isinstance(function.value, ast.Name) and function.value.id == "env"
        )
        first = node.args[0]
        if reads_env and isinstance(first, ast.Constant) and isinstance(first.value, str):
            names.add(first.value)
    return names


def all_links() -> list[Link]:
    return [link for path in doc_files() for link in relative_links(path)]


@pytest.mark.parametrize(
    "link", all_links(), ids=lambda link: f"{link.path.relative_to(ROOT)}:{link.line}:{link.target}"
)
def test_every_relative_link_resolves(link: Link) -> None:
    assert broken(link) is None, broken(link)


def test_the_docs_have_links_to_check() -> None:
    pages = {link.path.name for link in all_links()}
    assert {"README.md", "api.md", "configuration.md"} <= pages


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Weight formats (`MODEL_WEIGHTS`)", "weight-formats-model_weights"),
        ("Your own model: a GGUF file", "your-own-model-a-gguf-file"),
        ("Structured output's mask cost", "structured-outputs-mask-cost"),
        ("Bigger models: GGUF files against llama-server", "bigger-models-gguf-files-against-llama-server"),
    ],
)
def test_anchors_follow_githubs_rules(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_a_missing_file_or_heading_is_reported() -> None:
    readme = ROOT / "README.md"
    assert broken(Link(readme, 1, "docs/no-such-page.md")) is not None
    assert broken(Link(readme, 1, "docs/api.md#no-such-heading")) is not None
    assert broken(Link(readme, 1, "docs/api.md#errors")) is None


def test_settings_are_read_from_the_environment() -> None:
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "MODEL_PATH"} <= environment_settings()


def test_the_configuration_page_lists_exactly_the_settings() -> None:
    documented = table_names(CONFIGURATION, "Settings")
    read = environment_settings()
    assert not read - documented, f"read by settings.py but not in docs/configuration.md: {sorted(read - documented)}"
    assert not documented - read, f"in docs/configuration.md but not read by settings.py: {sorted(documented - read)}"
