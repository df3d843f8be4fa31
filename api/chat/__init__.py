"""``POST /v1/chat/completions``: its protocol (request, checks, response shapes) and its serving."""
