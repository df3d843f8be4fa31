"""An incoming X-Request-ID is echoed only when it is well formed: 1 to 128 of [A-Za-z0-9._-]."""

from __future__ import annotations

import pytest

from api.access import well_formed_request_id


@pytest.mark.parametrize("value", ["a", "req_0123abcd", "A.b-c_d", "x" * 128, "7f9c1e2a-4b3d-4c5e-8f6a-0b1c2d3e4f5a"])
def test_well_formed_request_ids(value):
    assert well_formed_request_id(value)


@pytest.mark.parametrize("value", [None, "", "x" * 129, "a b", "a/b", "id\n", "é", "a;b", "<script>"])
def test_malformed_request_ids(value):
    assert not well_formed_request_id(value)
