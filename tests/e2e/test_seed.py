"""``seed``: the same request with the same seed gets the same text, whatever else the server is doing.

Each candidate samples with a generator of its own (candidate ``j`` from ``seed + j``), so neither
other requests in the batch nor the request's own ``n`` change what it draws.  (On this CPU the
default configuration runs bfloat16 and, for small batches, int4 weights, where a near-tie in the
logits can move with the batch, so these tests run the deterministic mode, ``MODEL_DTYPE=float32
MODEL_WEIGHTS=float32``, as docs/api.md's guarantee says.)
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from testing.live_server import MODEL, start_server, stop_server
from tests.completion_helpers import NO_EOS, complete

SEEDED = {
    "prompt": "Once upon a time",
    "max_tokens": 8,
    "temperature": 1.0,
    "top_p": 0.95,
    "seed": 2024,
    "n": 2,
    "logprobs": 1,
    "logit_bias": NO_EOS,
}
OTHERS = ["The weather is", "def add(a, b):", "1, 2, 3,"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server in the deterministic mode (this module's own: it overrides the shared one)."""
    live = start_server(tmp_path_factory.mktemp("seed"), MODEL_DTYPE="float32", MODEL_WEIGHTS="float32")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def alone(server) -> dict:
    return complete(server, **SEEDED)


def test_the_same_seed_gives_the_same_choices_again(server, alone):
    assert complete(server, **SEEDED)["choices"] == alone["choices"]


def test_the_same_seed_gives_the_same_choices_while_other_requests_run(server, alone):
    with ThreadPoolExecutor(len(OTHERS) + 1) as pool:
        others = [
            pool.submit(server.post, {"model": MODEL, "prompt": p, "max_tokens": 10, "temperature": 1.0})
            for p in OTHERS
        ]
        busy = pool.submit(complete, server, **SEEDED)
        assert all(other.result().status_code == 200 for other in others)
    assert [c["text"] for c in busy.result()["choices"]] == [c["text"] for c in alone["choices"]]


def test_a_candidate_draws_the_same_whatever_n_is(server, alone):
    single = complete(server, **{**SEEDED, "n": 1})
    assert single["choices"][0]["text"] == alone["choices"][0]["text"]


def test_another_seed_gives_other_text(server, alone):
    other = complete(server, **{**SEEDED, "seed": SEEDED["seed"] + 100})
    assert [c["text"] for c in other["choices"]] != [c["text"] for c in alone["choices"]]
