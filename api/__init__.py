"""The OpenAI HTTP surface: errors in OpenAI's shape, request schemas, response builders, SSE, views.

It imports the engine (``inference``) and the domain (``keys``) and translates their errors into
HTTP; neither of them imports it back (``tests/unit/test_import_layers.py``).
"""
