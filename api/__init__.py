"""The OpenAI HTTP surface: one package per generation endpoint over what they share.

It imports the engine (``inference``) and the domain (``keys``) and translates their errors into
HTTP; neither of them imports it back, and no module of it imports itself through a circle
(``tests/unit/test_import_layers.py``).

- ``completions/`` and ``chat/``: each endpoint's ``protocol`` (request parsing and checks, response
  and chunk shapes) and ``serving`` (one request in flight: ``CompletionRun``, ``ChatRun``).
- ``generation.py``: what both runs share (engine streams merged, token counts, abort).
- ``protocol.py``: what both protocols share (the vendored spec, common fields and checks, usage,
  ``/v1/models``); ``response_format.py``: structured output for both; ``types.py``: response types.
- ``errors/``: OpenAI's error shape and the translation of schema errors into it (``organization``
  imports it too); ``translate.py`` and ``auth.py``: the domain's refusals as HTTP errors.
- ``views.py`` (thin), ``accounting.py`` (one request's usage record and limits), ``sse.py``,
  ``handlers.py``, ``access.py``, ``draining.py``, ``metrics.py``, ``engine.py``, and the usage
  API (``usage_api.py``, ``usage_views.py``, ``query.py``).
"""
