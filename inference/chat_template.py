"""A chat's prompt ids: the model's chat template around the messages, whose contents stay text.

The template writes the turns' markers (``<|im_start|>``, ``<start_of_turn>``, ...) itself; a
message that spells one is text, as OpenAI reads message content, so a user cannot forge a system or
assistant turn.  Tokenizing the rendered text whole would read every spelling of a special token as
that token, wherever it came from.

A conversation whose contents spell no special token is tokenized whole, exactly as transformers'
``apply_chat_template(tokenize=True)`` does.  Otherwise each spelling in the contents is swapped for
a placeholder before rendering (templates may trim or split contents; a placeholder survives that),
so every special token left in the rendered text is the template's.  The text is cut at those, as the
tokenizer cuts at added tokens, and each piece between them, placeholders turned back into their
text, is encoded with special tokens read as text (``split_special_tokens``).  For byte-level BPE
(GPT-2's, Llama 3's, SmolLM2's) and Gemma's tokenizers the pieces encode as they would in one call;
a sentencepiece tokenizer that marks only the text's first word (``prepend_scheme="first"``) marks
each piece's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Opens every placeholder (``\ue000`` index ``\ue001``): private-use characters, in no special token;
# a content's own ``\ue000`` is swapped out too, so it can never read as a placeholder.
PLACEHOLDER_MARK = "\ue000"
_PLACEHOLDER = re.compile("\ue000([0-9]+)\ue001")


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> str:
    """The chat template's text for ``messages``, with the assistant's generation prompt added.

    Raises jinja2's ``TemplateError`` when the template refuses the conversation.
    """
    text = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=False)
    assert isinstance(text, str)
    return text


def chat_prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of ``messages`` (``{"role", "content"}``) through the template, contents as text.

    The ids hold a special token only where the template wrote it; a conversation that spells no
    special token gets ``apply_chat_template(..., add_generation_prompt=True, tokenize=True)``'s ids.
    """
    specials = special_tokens(tokenizer)
    pattern = _alternation(specials)
    if not any(pattern.search(message["content"]) for message in messages):
        # The template writes its special tokens itself; adding the tokenizer's would double a BOS.
        return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
    literals = [*specials, PLACEHOLDER_MARK]
    escape = _alternation(literals)
    index = {literal: i for i, literal in enumerate(literals)}

    def placeholder(match: re.Match[str]) -> str:
        return f"\ue000{index[match.group()]}\ue001"

    escaped = [{**message, "content": escape.sub(placeholder, message["content"])} for message in messages]
    return _encode_marked(tokenizer, render_chat(tokenizer, escaped), specials, literals)


def special_tokens(tokenizer: PreTrainedTokenizerBase) -> dict[str, Any]:
    """The special tokens' texts, longest first, each with its ``AddedToken`` (None when the
    tokenizer names it but does not list it among its added tokens)."""
    found: dict[str, Any] = {}
    for token in tokenizer.added_tokens_decoder.values():
        if token.special:
            found[token.content] = token
    for text in tokenizer.all_special_tokens:
        found.setdefault(text, None)
    return {text: found[text] for text in sorted(found, key=len, reverse=True) if text}


def _alternation(texts: Sequence[str] | dict[str, Any]) -> re.Pattern[str]:
    """One pattern matching any of ``texts`` (longest first, so the longer of two overlapping wins)."""
    return re.compile("|".join(re.escape(text) for text in texts) or "(?!)")


def _encode_marked(
    tokenizer: PreTrainedTokenizerBase, text: str, specials: dict[str, Any], literals: list[str]
) -> list[int]:
    """Ids of ``text``: its special tokens as themselves, the pieces between them as text, each
    placeholder as the literal it stands for."""
    ids: list[int] = []
    pieces = _alternation(specials).split(text)
    markers = _alternation(specials).findall(text)
    for k, piece in enumerate(pieces):
        before = specials[markers[k - 1]] if k > 0 else None
        after = specials[markers[k]] if k < len(markers) else None
        # An added token that strips whitespace beside it takes it, as in one call.
        if before is not None and before.rstrip:
            piece = piece.lstrip()
        if after is not None and after.lstrip:
            piece = piece.rstrip()
        piece = _PLACEHOLDER.sub(lambda match: literals[int(match.group(1))], piece)
        if piece:
            ids += tokenizer.encode(piece, add_special_tokens=False, split_special_tokens=True)
        if k < len(markers):
            token_id = tokenizer.convert_tokens_to_ids(markers[k])
            assert isinstance(token_id, int)
            ids.append(token_id)
    return ids
