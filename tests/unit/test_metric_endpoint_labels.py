"""The gateway's ``endpoint`` label: a bounded set of names, never a path holding ids."""

from __future__ import annotations

import pytest

from api.metrics import endpoint_label


@pytest.mark.parametrize(
    ("path", "label"),
    [
        ("/v1/completions", "/v1/completions"),
        ("/v1/models/smollm2-135m-instruct", "/v1/models/{model}"),
        ("/v1/organization/users", "/v1/organization"),
        ("/v1/organization/projects/user_2/api_keys/key_AbCd1234", "/v1/organization"),
        ("/v1/organization/audit_logs", "/v1/organization"),
        ("/v1/nothing-here", "/v1/other"),
        ("/admin/", "site"),
    ],
)
def test_each_path_gets_its_bounded_label(path, label):
    assert endpoint_label(path) == label
