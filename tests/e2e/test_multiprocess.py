"""Two daphne processes behind one API, sharing PostgreSQL and Redis, as a hosted deployment runs.

Limits hold across the processes (not once per process), a revocation through one process is
refused by the other on the next request, a key created, changed or deleted through one process's
Administration API is served or refused accordingly by the other on its very next request (and
the audit log names the admin key), and concurrent streamed and interrupted requests leave exactly
one usage record each.  The servers get a PostgreSQL database of their own (created from the
``test`` database and dropped afterwards) and a Redis key prefix of their own; without PostgreSQL
or Redis the module is skipped.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from datetime import timezone as dt_timezone

import httpx
import pytest

from testing.live_server import MODEL, LiveServer, _manage, start_server, stop_server
from testing.postgres import POSTGRES_URL, postgres_reachable, scratch_database
from tests.conftest import TEST_REDIS_URL, redis_reachable

NO_EOS = {"0": -100, "2": -100}  # neither end-of-text token: every request makes exactly max_tokens


@dataclass
class Cluster:
    """Two servers on one database and one Redis prefix."""

    servers: list[LiveServer]
    database_url: str
    redis_prefix: str

    def create_key(self, name: str, *options: str) -> str:
        return (
            self.servers[0].manage("create_api_key", "--name", name, "--user", "e2e", *options).strip().splitlines()[-1]
        )

    def query(self, sql: str, *params) -> list[tuple]:
        import psycopg

        with psycopg.connect(self.database_url) as connection:
            return connection.execute(sql, params).fetchall()

    def key_id(self, plaintext: str) -> int:
        prefix = re.fullmatch(r"sk-cs-([A-Za-z0-9]{8})\..+", plaintext)[1]
        return self.query("SELECT id FROM keys_apikey WHERE prefix = %s", prefix)[0][0]

    def post(self, index: int, key: str, body: dict, **kwargs) -> httpx.Response:
        return self.servers[index % 2].post({"model": MODEL, **body}, key=key, **kwargs)

    def organization(
        self, index: int, method: str, path: str, key: str, body: dict | None = None, **params: str
    ) -> httpx.Response:
        """``method /v1/organization{path}`` on server ``index`` with an admin key."""
        url = self.servers[index % 2].api_url + "/organization" + path
        return httpx.request(
            method, url, json=body, params=params, headers={"Authorization": f"Bearer {key}"}, timeout=30
        )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    if not postgres_reachable(POSTGRES_URL):
        pytest.skip(f"PostgreSQL is not reachable at {POSTGRES_URL} (set E2E_POSTGRES_URL)")
    if not redis_reachable(TEST_REDIS_URL):
        pytest.skip(f"Redis is not reachable at {TEST_REDIS_URL} (set REDIS_URL)")
    with scratch_database("completions_e2e") as database_url:
        yield from _cluster(tmp_path_factory, database_url)


def _cluster(tmp_path_factory, database_url: str) -> Iterator[Cluster]:
    prefix = f"completions-site-e2e:{uuid.uuid4().hex[:12]}:"
    settings = {
        "REDIS_URL": TEST_REDIS_URL,
        "API_LIMITS_REDIS_PREFIX": prefix,
        "ENGINE_NUM_THREADS": "1",  # two servers share the machine's cores
        "LOG_LEVEL": "WARNING",
    }
    servers: list[LiveServer] = []
    try:
        servers.append(start_server(tmp_path_factory.mktemp("first"), database_url=database_url, **settings))
        # Started once the first is up: it has migrated the database and converted the model.
        servers.append(
            start_server(tmp_path_factory.mktemp("second"), database_url=database_url, key=servers[0].key, **settings)
        )
        _manage(
            servers[0].env,
            "shell",
            "-v",
            "0",
            "-c",
            "from django.contrib.auth.models import User; User.objects.create_superuser('ops', '', 'ops-password-1')",
        )
        yield Cluster(servers, database_url, prefix)
    finally:
        for server in servers:
            stop_server(server)  # which deletes the shared prefix's counters too


@dataclass
class Operator:
    """An admin key made on the command line, and a customer it created through the Administration API."""

    admin_key: str
    admin_key_id: str
    customer_id: str


@pytest.fixture(scope="module")
def operator(cluster) -> Operator:
    output = cluster.servers[0].manage("create_admin_key", "--name", "provisioning", "--user", "ops")
    admin_key = output.strip().splitlines()[-1]
    prefix = re.fullmatch(r"sk-cs-admin-([A-Za-z0-9]{8})\..+", admin_key)[1]
    created = cluster.organization(0, "POST", "/users", admin_key, {"username": "carol", "role": "reader"})
    assert created.status_code == 200, created.text
    return Operator(admin_key, f"key_{prefix}", created.json()["id"])


def test_a_key_with_rpm_10_gets_exactly_10_successes_out_of_30_requests_over_both_processes(cluster):
    key = cluster.create_key("rpm10", "--rpm", "10")
    started = time.monotonic()

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda i: cluster.post(i, key, {"prompt": "Hi", "max_tokens": 1}), range(30)))

    assert time.monotonic() - started < 55  # all within one window
    assert Counter(r.status_code for r in replies) == {200: 10, 429: 20}
    for refused in (r for r in replies if r.status_code == 429):
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert refused.json()["error"]["type"] == "requests"
        assert "Limit 10, Used 10, Requested 1" in refused.json()["error"]["message"]
        assert 1 <= int(refused.headers["retry-after"]) <= 60
    # One counter for both processes: the ten successes saw 9, 8, ... 0 requests left, each once.
    remaining = sorted(int(r.headers["x-ratelimit-remaining-requests"]) for r in replies if r.status_code == 200)
    assert remaining == list(range(10))
    served_by = {r.request.url.port for r in replies if r.status_code == 200}
    assert len(served_by) == 2


def test_a_users_rpm_10_binds_across_three_of_their_keys_over_both_processes(cluster, operator):
    """A user's limit counts every key of theirs, on one shared counter across processes."""
    admin = operator.admin_key
    created = cluster.organization(0, "POST", "/users", admin, {"username": "erin", "role": "reader"})
    assert created.status_code == 200, created.text
    user = created.json()["id"]
    limits = cluster.organization(0, "POST", f"/users/{user}/limits", admin, {"max_requests_per_1_minute": 10})
    assert limits.status_code == 200, limits.text
    keys = []
    for name in ("a", "b", "c"):
        created = cluster.organization(1, "POST", f"/projects/{user}/api_keys", admin, {"name": name})
        assert created.status_code == 200, created.text
        keys.append(created.json()["value"])

    with ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda i: cluster.post(i, keys[i % 3], {"prompt": "Hi", "max_tokens": 1}), range(30)))

    assert Counter(r.status_code for r in replies) == {200: 10, 429: 20}
    for refused in (r for r in replies if r.status_code == 429):
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        assert "your account" in refused.json()["error"]["message"]  # the user's limit, not a key's
    assert len({r.request.url.port for r in replies if r.status_code == 200}) == 2


def test_eight_concurrent_requests_do_not_overshoot_a_tpm_limit(cluster):
    key = cluster.create_key("tpm100", "--tpm", "100")
    # A 10-token prompt (token ids) and 20 new tokens: each request reserves, and uses, 30.
    body = {"prompt": list(range(1000, 1010)), "max_tokens": 20, "logit_bias": NO_EOS}

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: cluster.post(i, key, body), range(8)))

    admitted = [r for r in replies if r.status_code == 200]
    assert len(admitted) == 3 and sum(r.json()["usage"]["total_tokens"] for r in admitted) == 90
    for refused in (r for r in replies if r.status_code == 429):
        assert refused.json()["error"]["type"] == "tokens"
        assert "Limit 100, Used 90, Requested 30" in refused.json()["error"]["message"]


def test_a_key_revoked_through_one_process_is_refused_by_the_other_on_its_next_request(cluster):
    key = cluster.create_key("to revoke")
    assert cluster.post(1, key, {"prompt": "Hi", "max_tokens": 1}).status_code == 200

    admin = cluster.servers[0].base_url + "/admin/"
    with httpx.Client(base_url=admin, timeout=30) as browser:
        login = browser.get("login/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login.text)[1]
        browser.post(
            "login/",
            data={"username": "ops", "password": "ops-password-1", "csrfmiddlewaretoken": token, "next": "/admin/"},
        )
        changelist = browser.get("keys/apikey/")
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', changelist.text)[1]
        done = browser.post(
            "keys/apikey/",
            data={"action": "revoke_selected", "_selected_action": cluster.key_id(key), "csrfmiddlewaretoken": token},
            follow_redirects=True,
        )
        assert "Revoked 1 of 1 selected keys." in done.text

    refused = cluster.post(1, key, {"prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def test_limits_changed_through_one_process_administration_api_apply_to_the_next_request_on_the_other(
    cluster, operator
):
    admin, keys = operator.admin_key, f"/projects/{operator.customer_id}"
    body = {"prompt": "Hi", "max_tokens": 1, "logit_bias": NO_EOS}  # uses exactly what it reserves
    created = cluster.organization(
        0,
        "POST",
        keys + "/api_keys",
        admin,
        {"name": "limited", "max_requests_per_1_minute": 3, "max_tokens_per_1_minute": 1000},
    )
    assert created.status_code == 200, created.text
    key, key_id = created.json()["value"], created.json()["id"]
    rate_limit = "/rate_limits/" + key_id.replace("key_", "rl_", 1)

    def change(path: str, fields: dict) -> None:
        answer = cluster.organization(0, "POST", keys + path, admin, fields)
        assert answer.status_code == 200, answer.text

    served = cluster.post(1, key, body)  # at once, on the other process
    assert served.status_code == 200, served.text
    assert served.headers["x-ratelimit-limit-requests"] == "3"
    cost = served.json()["usage"]["total_tokens"]  # what the same request reserves

    change(rate_limit, {"max_requests_per_1_minute": 1})
    refused = cluster.post(1, key, body)
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "requests"
    assert "Limit 1, Used 1, Requested 1" in refused.json()["error"]["message"]

    change(rate_limit, {"max_requests_per_1_minute": 0, "max_tokens_per_1_minute": 2 * cost - 1})
    refused = cluster.post(1, key, body)  # it fits alone, not beside the first request's tokens
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "tokens"
    assert f"Limit {2 * cost - 1}, Used {cost}, Requested {cost}" in refused.json()["error"]["message"]

    change("/api_keys/" + key_id, {"models": ["another-model"], "max_tokens_per_1_minute": None})
    refused = cluster.post(1, key, body)
    assert refused.status_code == 404
    assert (refused.json()["error"]["code"], refused.json()["error"]["param"]) == ("model_not_found", "model")

    change("/api_keys/" + key_id, {"models": [MODEL], "max_tokens_per_1_month": cost})
    refused = cluster.post(1, key, body)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "insufficient_quota"
    assert f"may use {cost} tokens per calendar month, {cost} are used" in refused.json()["error"]["message"]

    change("/api_keys/" + key_id, {"max_tokens_per_1_month": None, "expires_at": int(time.time()) - 1})
    refused = cluster.post(1, key, body)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"

    change("/api_keys/" + key_id, {"expires_at": None})
    assert cluster.post(1, key, body).status_code == 200
    assert _audit_log(cluster, 1, operator, key_id) == ["api_key.updated"] * 6 + ["api_key.created"]


def test_a_concurrency_limit_set_through_one_process_administration_api_counts_the_other_process_requests(
    cluster, operator
):
    admin, keys = operator.admin_key, f"/projects/{operator.customer_id}"
    created = cluster.organization(0, "POST", keys + "/api_keys", admin, {"name": "one at a time"})
    key, key_id = created.json()["value"], created.json()["id"]
    changed = cluster.organization(
        0, "POST", keys + "/rate_limits/" + key_id.replace("key_", "rl_", 1), admin, {"max_concurrent_requests": 1}
    )
    assert changed.json()["max_concurrent_requests"] == 1

    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 1000, "logit_bias": NO_EOS, "stream": True}
    with httpx.stream(
        "POST",
        cluster.servers[1].api_url + "/completions",
        json=body,
        timeout=60,
        headers={"Authorization": f"Bearer {key}"},
    ) as streaming:
        assert streaming.status_code == 200
        lines = streaming.iter_lines()  # held: a dropped line iterator would close the connection
        next(line for line in lines if line.startswith("data: {"))  # under way on B
        refused = cluster.post(0, key, {"prompt": "Hi", "max_tokens": 1})
        assert not streaming.is_closed
    assert refused.status_code == 429 and refused.json()["error"]["type"] == "requests"
    assert "Limit 1, Used 1, Requested 1" in refused.json()["error"]["message"]
    assert "concurrent requests" in refused.json()["error"]["message"]

    deadline = time.monotonic() + 10  # the disconnect frees the slot once B has seen it
    while (served := cluster.post(0, key, {"prompt": "Hi", "max_tokens": 1})).status_code == 429:
        assert time.monotonic() < deadline, served.text
        time.sleep(0.1)
    assert served.status_code == 200, served.text


def test_a_key_created_through_one_process_administration_api_works_at_once_and_deleted_through_the_other_is_refused(
    cluster, operator
):
    admin, keys = operator.admin_key, f"/projects/{operator.customer_id}/api_keys"
    created = cluster.organization(0, "POST", keys, admin, {"name": "short-lived"})
    assert created.status_code == 200, created.text
    key, key_id = created.json()["value"], created.json()["id"]
    assert cluster.post(1, key, {"prompt": "Hi", "max_tokens": 1}).status_code == 200
    assert cluster.post(0, key, {"prompt": "Hi", "max_tokens": 1}).status_code == 200

    deleted = cluster.organization(1, "DELETE", f"{keys}/{key_id}", admin)
    assert deleted.json() == {"object": "organization.project.api_key.deleted", "id": key_id, "deleted": True}

    refused = cluster.post(0, key, {"prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert cluster.organization(0, "GET", f"{keys}/{key_id}", admin).status_code == 404
    assert _audit_log(cluster, 0, operator, key_id) == ["api_key.deleted", "api_key.created"]


def test_a_user_deleted_through_one_process_administration_api_has_their_keys_refused_by_the_other_at_once(
    cluster, operator
):
    admin = operator.admin_key
    user = cluster.organization(1, "POST", "/users", admin, {"username": "dave", "role": "reader"}).json()["id"]
    created = cluster.organization(1, "POST", f"/projects/{user}/api_keys", admin, {"name": "dave's"})
    key = created.json()["value"]
    assert cluster.post(0, key, {"prompt": "Hi", "max_tokens": 1}).status_code == 200

    deleted = cluster.organization(0, "DELETE", f"/users/{user}", admin)
    assert deleted.json() == {"object": "organization.user.deleted", "id": user, "deleted": True}

    refused = cluster.post(1, key, {"prompt": "Hi", "max_tokens": 1})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert _audit_log(cluster, 1, operator, user) == ["user.updated", "user.added"]


def test_an_admin_key_created_through_one_process_works_on_the_other_and_deleted_through_it_is_refused_by_the_first(
    cluster, operator
):
    created = cluster.organization(0, "POST", "/admin_api_keys", operator.admin_key, {"name": "rotated"})
    assert created.status_code == 200, created.text
    admin_key, admin_key_id = created.json()["value"], created.json()["id"]
    assert cluster.organization(1, "GET", "/users", admin_key).status_code == 200

    deleted = cluster.organization(1, "DELETE", f"/admin_api_keys/{admin_key_id}", operator.admin_key)
    assert deleted.json() == {"id": admin_key_id, "object": "organization.admin_api_key.deleted", "deleted": True}

    refused = cluster.organization(0, "GET", "/users", admin_key)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"


def _audit_log(cluster: Cluster, index: int, operator: Operator, resource_id: str) -> list[str]:
    """The types of the audit log's entries about ``resource_id``, newest first, each by the operator's admin key."""
    answer = cluster.organization(index, "GET", "/audit_logs", operator.admin_key, **{"resource_ids[]": resource_id})
    assert answer.status_code == 200, answer.text
    entries = answer.json()["data"]
    for entry in entries:
        assert entry["actor"]["type"] == "api_key"
        assert entry["actor"]["api_key"]["id"] == operator.admin_key_id
        assert entry[entry["type"]]["id"] == resource_id
    return [entry["type"] for entry in entries]


def test_200_concurrent_requests_leave_200_records_whose_tokens_are_what_the_responses_reported(cluster):
    key = cluster.create_key("busy")
    key_id = cluster.key_id(key)
    outcomes = asyncio.run(_two_hundred_requests(cluster, key))

    deadline = time.monotonic() + 60
    while cluster.query("SELECT count(*) FROM keys_usagerecord WHERE api_key_id = %s", key_id)[0][0] < 200:
        assert time.monotonic() < deadline, "the usage records did not all arrive"
        time.sleep(0.2)
    time.sleep(1)  # and no more come

    rows = cluster.query(
        "SELECT request_id, prompt_tokens, completion_tokens, stream, finish_reason, status_code "
        "FROM keys_usagerecord WHERE api_key_id = %s",
        key_id,
    )
    records = {row[0]: row for row in rows}
    assert len(rows) == 200 and set(records) == {o["id"] for o in outcomes}
    reported = [o for o in outcomes if o["usage"] is not None]
    assert len(reported) == 134  # the non-streamed and the fully read streams
    for outcome in reported:
        record = records[outcome["id"]]
        assert (record[1], record[2]) == (outcome["usage"]["prompt_tokens"], outcome["usage"]["completion_tokens"])
    assert sum(records[o["id"]][1] + records[o["id"]][2] for o in reported) == sum(
        o["usage"]["total_tokens"] for o in reported
    )
    for outcome in (o for o in outcomes if o["usage"] is None):  # cut off by the client after one event
        record = records[outcome["id"]]
        assert record[3] and record[5] == 200 and 1 <= record[2] <= 6
        assert record[4] in ("interrupted", "length")  # "length" if it finished before the disconnect was seen

    # The daily rollup and the shared counters agree with the records, token for token.
    prompt, completion = (sum(row[i] for row in rows) for i in (1, 2))
    rollup = cluster.query(
        "SELECT sum(requests), sum(prompt_tokens), sum(completion_tokens) FROM keys_dailyusage WHERE api_key_id = %s",
        key_id,
    )[0]
    assert tuple(map(int, rollup)) == (200, prompt, completion)
    import redis

    counters = redis.Redis.from_url(TEST_REDIS_URL)
    month = datetime.now(dt_timezone.utc).strftime("%Y-%m")
    owner_id = cluster.query("SELECT owner_id FROM keys_apikey WHERE id = %s", key_id)[0][0]
    base = f"{cluster.redis_prefix}{{u{owner_id}}}:key:{key_id}"  # keys.limits.redis.RedisStore.key_names
    assert int(counters.get(f"{base}:month:{month}")) == prompt + completion
    assert int(counters.get(f"{base}:token-sum")) == prompt + completion
    for server in cluster.servers:
        log = server.log.read_text()
        assert "Could not record usage" not in log and "Could not settle" not in log, log[-3000:]


async def _two_hundred_requests(cluster: Cluster, key: str) -> list[dict]:
    """200 requests at once over both servers: a third plain, a third streamed, a third cut off."""
    headers = {"Authorization": f"Bearer {key}"}
    limits = httpx.Limits(max_connections=250, max_keepalive_connections=0)

    async def one(client: httpx.AsyncClient, i: int) -> dict:
        url = cluster.servers[i % 2].api_url + "/completions"
        body = {"model": MODEL, "prompt": f"Item {i}: the weather is", "max_tokens": 6, "logit_bias": NO_EOS}
        kind = i % 3
        if kind == 0:
            response = await client.post(url, json=body, headers=headers)
            assert response.status_code == 200, response.text
            return {"id": response.json()["id"], "usage": response.json()["usage"]}
        body.update(stream=True, stream_options={"include_usage": True})
        async with client.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            request_id, usage = response.headers["x-request-id"], None
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if kind == 2:
                    break  # the client goes after the first event
                event = __import__("json").loads(line[len("data: ") :])
                usage = event.get("usage") or usage
            if kind == 1:
                assert usage is not None
            return {"id": request_id, "usage": usage}

    async with httpx.AsyncClient(timeout=180, limits=limits) as client:
        return await asyncio.gather(*(one(client, i) for i in range(200)))
