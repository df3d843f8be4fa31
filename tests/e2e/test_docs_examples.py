"""Every code block of the README and docs/ runs as written against a live server.

``sh`` blocks run in bash, ``python`` blocks in this interpreter, with the docs' address
(``http://127.0.0.1:8000``) replaced by the live server's and the placeholder key ``sk-cs-...`` by a
real one. A block marked by ``<!-- fragment -->`` on the line before its fence is skipped
(docs/development.md says when to mark one); blocks in other languages show data and never run.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from testing.live_server import LiveServer
from testing.markdown import ROOT, CodeBlock, code_blocks, doc_files

DOCS_ADDRESS = "http://127.0.0.1:8000"
PLACEHOLDER_KEY = "sk-cs-..."
SHELLS = {"sh", "bash", "shell"}
# curl exits non-zero on an HTTP error (and still prints the body), so a 4xx fails the block.
SHELL_PRELUDE = 'curl() { command curl --silent --show-error --fail-with-body "$@"; }\n'


def runnable() -> list[CodeBlock]:
    return [
        block
        for path in doc_files()
        for block in code_blocks(path)
        if not block.fragment and block.language in SHELLS | {"python"}
    ]


def for_server(text: str, server: LiveServer) -> str:
    return text.replace(DOCS_ADDRESS, server.base_url).replace(PLACEHOLDER_KEY, server.key)


@pytest.mark.parametrize("block", runnable(), ids=lambda block: f"{block.path.relative_to(ROOT)}:{block.line}")
def test_code_block_runs_as_written(block: CodeBlock, server: LiveServer, tmp_path) -> None:
    code = for_server(block.text, server)
    env = {**os.environ, **server.env, "KEY": server.key}
    if block.language == "python":
        script = tmp_path / "example.py"
        script.write_text(code)
        command = [sys.executable, str(script)]
    else:
        command = ["bash", "-euo", "pipefail", "-c", SHELL_PRELUDE + code]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"exit {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
    if "curl" in code or "OpenAI(" in code:
        assert result.stdout.strip(), "the example printed nothing"


def test_the_readme_calls_both_endpoints() -> None:
    readme = "".join(block.text for block in runnable() if block.path.name == "README.md")
    assert "/v1/completions" in readme and "/v1/chat/completions" in readme
    assert "client.completions.create" in readme and "client.chat.completions.create" in readme
