"""``POST /v1/completions``: its protocol (request, checks, response shapes) and its serving (a request in flight)."""
