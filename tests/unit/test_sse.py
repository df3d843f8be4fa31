"""The SSE wire format (api/sse.py): one event, one line, whatever the generated text holds."""

from __future__ import annotations

import json

from api import sse


def test_an_event_is_one_line_for_str_splitlines_even_with_unicode_line_separators():
    # JSON leaves U+0085, U+2028 and U+2029 unescaped, and httpx's aiter_lines splits on them.
    text = "a\x85b\u2028c\u2029d\n\re\x0b\x1cé"
    raw = sse.event({"choices": [{"text": text}]})
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    line = raw.decode()[len("data: ") : -2]
    assert line.splitlines() == [line]
    assert json.loads(line) == {"choices": [{"text": text}]}
    assert "é" in line  # other characters stay as they are (UTF-8, not \\u escapes)
