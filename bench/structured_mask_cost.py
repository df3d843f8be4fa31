"""Per-step cost of a grammar's token mask with llguidance and with xgrammar, on this CPU.

Usage (from the repository root; xgrammar is measured only if importable, e.g. installed with
``pip install --target /tmp/xg --no-deps xgrammar apache-tvm-ffi`` and ``PYTHONPATH=/tmp/xg``)::

    .venv/bin/python bench/structured_mask_cost.py

It walks the tokens of one valid answer to a JSON schema and, at each step, times filling the
``[1, ceil(vocab / 32)]`` int32 bitmask (the cost every constrained row adds to every decode step)
and then accepting the token.  Prints the compile time and the median / p90 mask time in µs.
"""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

from transformers import AutoTokenizer

from inference.model_loader import converted_gguf_dir, embedded_gguf_path

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "tags", "address"],
    "additionalProperties": False,
}
ANSWER = json.dumps(
    {
        "name": "Ada Lovelace",
        "age": 36,
        "tags": ["math", "engines", "poetry"],
        "address": {"city": "London", "zip": "W1"},
    }
)


def _stats(name: str, compile_s: float, times: list[float]) -> None:
    times = sorted(times)
    print(
        f"{name}: compile {compile_s * 1000:.1f} ms; mask per step median {statistics.median(times) * 1e6:.0f} µs, "
        f"p90 {times[int(len(times) * 0.9)] * 1e6:.0f} µs over {len(times)} steps"
    )


def bench_llguidance(tokenizer, vocab: int, ids: list[int]) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
    started = time.perf_counter()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA))
    matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
    compile_s = time.perf_counter() - started
    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)
    times = []
    for token in ids:
        started = time.perf_counter()
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
        times.append(time.perf_counter() - started)
        assert matcher.consume_token(token), matcher.get_error()
    _stats("llguidance", compile_s, times)


def bench_xgrammar(tokenizer, vocab: int, ids: list[int]) -> None:
    try:
        import xgrammar
    except ImportError as error:
        print(f"xgrammar: not importable ({error})")
        return
    info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
    compiler = xgrammar.GrammarCompiler(info)
    started = time.perf_counter()
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA))
    matcher = xgrammar.GrammarMatcher(compiled)
    compile_s = time.perf_counter() - started
    bitmask = xgrammar.allocate_token_bitmask(1, vocab)
    times = []
    for token in ids:
        started = time.perf_counter()
        matcher.fill_next_token_bitmask(bitmask, 0)
        times.append(time.perf_counter() - started)
        assert matcher.accept_token(token)
    _stats("xgrammar", compile_s, times)


def main() -> None:
    folder = converted_gguf_dir(embedded_gguf_path(), Path(".cache/models"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    vocab = len(tokenizer)
    ids = tokenizer.encode(ANSWER, add_special_tokens=False)
    bench_llguidance(tokenizer, vocab, ids)
    bench_xgrammar(tokenizer, vocab, ids)


if __name__ == "__main__":
    main()
