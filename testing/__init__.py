"""Helpers shared by the tests, the benchmarks (``bench/``) and the tools (``tools/``).

``live_server`` starts a real daphne server with the embedded model; ``tiny_model`` builds a small
random Llama and its tokenizer; ``tiny_engine`` starts the engine on it; ``sse_client`` reads a
stream; ``browser`` drives Debian's Chromium through Playwright.  Importable without Django set up.
"""
