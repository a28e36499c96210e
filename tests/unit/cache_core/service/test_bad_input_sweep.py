"""A systematic bad-input sweep over every HTTP endpoint: malformed bodies, each field missing,
null, of the wrong type, empty, blank, oversized, NaN/Infinity, lone surrogates, unknown fields,
wrong content type, bad admin tokens, odd path parameters, odd chat ``messages``.

Every bad request must be a 4xx with a readable ``detail`` (never a 5xx), and lose nothing:
the entries stored before the sweep are still served, /healthz is fine, and a restart from the
snapshot directory restores them. The status chosen per case: 422 for a body or parameter that
does not validate (the strict schemas forbid unknown fields, so they are 422 too), 401/403 for a
missing/wrong admin token, 404 for an unknown experiment, 409 for a stale config version.
Accepted on purpose (see ``ACCEPTED``): unknown fields in chat requests (OpenAI fields are passed
upstream), ids that are blank but not empty (ids are opaque; the cache refuses
only empty ones), and namespaces with odd characters in admin paths (any stored namespace, "/"
included, can be cleared)."""
from __future__ import annotations

import copy
import json
import re

from types import SimpleNamespace

import pytest
import yaml
from fastapi.testclient import TestClient
from kafka import TopicPartition

from cache_core.publish.control_topic import ControlListener, parse_control
from cache_core.events import ControlMessage
from cache_core.experiments import ExperimentConfig, load_experiments

from cache_core.state.persistence import Persistence
from cache_core.registry import ExperimentRegistry
from cache_core.service.app import create_app
from cache_core.service.wiring import build_components
from cache_core.settings import Settings
from tests.unit.cache_core.helpers import RecordingPublisher
from tests.unit.cache_core.service.test_service_chat_admin import TOKEN, ControlRecorder, Upstream

AUTH = {"authorization": f"Bearer {TOKEN}"}
JSON = {"content-type": "application/json"}
MAX_QUERY, MAX_ANSWER = 200, 1000
SURROGATE = "\ud800"  # sent escaped: json.dumps writes "\ud800"
NAN = float("nan")

SEEDED = [("How do I reset my password?", "Use the reset link.", "default"),
          ("When will my card arrive?", "Within five working days.", "tenant/a")]

LOOKUP = {"query": "how can I change my password", "unit_id": "u1"}
STORE = {"query": "a question nobody asked", "unit_id": "u1", "answer": "an answer"}
FEEDBACK = {"request_id": "r1", "verdict": "wrong"}
PURGE = {"query": "a question nobody asked"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}


def _experiment() -> dict:
    registry = ExperimentRegistry.from_file(Settings().experiments_file)
    config = registry.get("threshold-ab").model_dump(mode="json")
    return {**config, "version": config["version"] + 1}


EXPERIMENT = _experiment()


def with_(base: dict, **changes) -> dict:
    body = copy.deepcopy(base)
    for key, value in changes.items():
        if value is _MISSING:
            body.pop(key, None)
        else:
            body[key] = value
    return body


_MISSING = object()


def encoded(body) -> bytes:
    """JSON as a lenient client might send it: NaN/Infinity literals, surrogates escaped; a
    ``bytes`` value anywhere is written as the raw literal it holds (e.g. 1e999)."""
    if isinstance(body, bytes):
        return body
    text = json.dumps(body, default=lambda raw: f"__raw__{raw.decode()}__raw__")
    return re.sub(r'"__raw__(.*?)__raw__"', r"\1", text).encode()


# -- the matrix -------------------------------------------------------------------------

def _body_cases(base: dict) -> list[tuple[str, bytes]]:
    """Malformed bodies any POST/PUT endpoint with a JSON object body must refuse."""
    text = encoded(base)
    return [("empty body", b""), ("not json", b"{not json"), ("truncated", text[:-3]),
            ("array", b"[]"), ("array of the body", encoded([base])), ("string", b'"hello"'),
            ("number", b"42"), ("null", b"null"), ("true", b"true"), ("empty object", b"{}"),
            ("bytes not utf-8", b"\xff\xfe{}"), ("latin-1 body", text.replace(b'"', b'"\xe9', 1)),
            ("NaN body", b"NaN"), ("two objects", text + text)]


def _field_cases(base: dict, field: str, *, required: bool, kind: str, limit: int | None = None):
    """Bad values of one field. ``kind``: text (free text, blank refused), id (min 1, ``limit``),
    float (a positive count or duration), bool, enum."""
    value = base.get(field, "x")
    cases = []
    if required:
        cases.append((f"{field} missing", with_(base, **{field: _MISSING})))
    if kind in ("text", "id", "enum"):
        cases += [(f"{field} null", with_(base, **{field: None}))] if required else []
        cases += [(f"{field} {name}", with_(base, **{field: bad})) for name, bad in
                  (("list", [value]), ("object", {"v": value}), ("bool", True), ("number", 7),
                   ("float", 1.5), ("NaN", NAN), ("Infinity", float("inf")), ("empty", ""),
                   ("lone surrogate", SURROGATE), ("surrogate inside", f"ab{SURROGATE}cd"),
                   ("low surrogate", "\udfff"))]
    if kind == "text":
        cases += [(f"{field} blank", with_(base, **{field: " \t\n "}))]
    if limit is not None:
        cases += [(f"{field} oversized", with_(base, **{field: "x" * (limit + 1)})),
                  (f"{field} 1 MB", with_(base, **{field: "y" * 1_000_000}))]
    if kind == "float":
        cases += [(f"{field} {name}", with_(base, **{field: bad})) for name, bad in
                  (("negative", -1), ("zero", 0), ("NaN", NAN), ("Infinity", float("inf")),
                   ("-Infinity", float("-inf")), ("overflow", b"1e999"), ("string", "soon"),
                   ("numeric string", "60"), ("bool", True), ("list", [60]), ("object", {"s": 60}))]
    if kind == "bool":
        cases += [(f"{field} {name}", with_(base, **{field: bad})) for name, bad in
                  (("string", "yes"), ("string true", "true"), ("number", 1), ("null", None), ("list", [True]))]
    if kind == "enum":
        cases += [(f"{field} unknown", with_(base, **{field: "maybe"})),
                  (f"{field} upper case", with_(base, **{field: str(value).upper()}))]
    return cases


def _literal(cases):
    return [(name, encoded(body)) for name, body in cases]


def _lookup_cases():
    cases = _field_cases(LOOKUP, "query", required=True, kind="text", limit=MAX_QUERY)
    cases += _field_cases(LOOKUP, "unit_id", required=True, kind="id", limit=256)
    for field, limit in (("experiment_id", 64), ("namespace", 128), ("scope", 256)):
        cases += _field_cases(LOOKUP, field, required=False, kind="id", limit=limit)
    cases += [("unknown field", with_(LOOKUP, extra=1)), ("answer on a lookup", with_(LOOKUP, answer="a")),
              ("unknown experiment", with_(LOOKUP, experiment_id="nope")), ("namespace null", with_(LOOKUP, namespace=None))]
    return cases


def _store_cases():
    cases = [(n, b) for n, b in _lookup_cases() if "answer on a lookup" not in n]
    cases = [(n, with_(b, answer=STORE["answer"]) if "answer" not in b else b) for n, b in cases]
    cases += _field_cases(STORE, "answer", required=True, kind="text", limit=MAX_ANSWER)
    cases += _field_cases(STORE, "ttl_s", required=False, kind="float")
    cases += [(f"provenance {name}", with_(STORE, provenance=bad)) for name, bad in
              (("string", "kb"), ("list", ["kb"]), ("null", None), ("unknown field", {"src": "kb"}),
               ("source number", {"source": 7}), ("source oversized", {"source": "s" * 257}),
               ("version oversized", {"version": "v" * 129}), ("source surrogate", {"source": SURROGATE}))]
    return cases


def _batch_cases():
    cases = [("items missing", {}), ("items null", {"items": None}), ("items object", {"items": STORE}),
             ("items string", {"items": "x"}), ("items empty", {"items": []}),
             ("items too many", {"items": [STORE] * 513}), ("item null", {"items": [None]}),
             ("item string", {"items": ["x"]}), ("item list", {"items": [[STORE]]}),
             ("unknown field", {"items": [STORE], "extra": 1})]
    cases += [(f"every_arm {n}", {"items": [STORE], "every_arm": v}) for n, v in
              (("string", "yes"), ("number", 1), ("null", None))]
    # One bad item refuses the whole batch (nothing of it is stored).
    cases += [(f"item 1 {name}", {"items": [STORE, body]}) for name, body in _store_cases()]
    return cases


def _feedback_cases():
    cases = _field_cases(FEEDBACK, "request_id", required=True, kind="id", limit=128)
    cases += _field_cases(FEEDBACK, "verdict", required=True, kind="enum")
    cases += _field_cases(FEEDBACK, "source", required=False, kind="id", limit=64)
    return cases + [("unknown field", with_(FEEDBACK, note="x")), ("source null", with_(FEEDBACK, source=None))]


def _purge_cases():
    cases = [("nothing to match", {}), ("version without source", {"provenance_version": "1"}),
             ("all null", {"provenance_source": None, "query": None}), ("unknown field", with_(PURGE, everything=True))]
    cases += [(n, b) for n, b in _field_cases(PURGE, "query", required=False, kind="text")]
    cases += _field_cases({"provenance_source": "kb"}, "provenance_source", required=False, kind="id", limit=256)
    cases += [(f"version {n}", {"provenance_source": "kb", "provenance_version": v}) for n, v in
              (("number", 1), ("oversized", "v" * 129), ("surrogate", SURROGATE))]
    return cases


def _experiment_cases():
    arm = EXPERIMENT["arms"][0]
    arms = lambda **change: [{**arm, **change}] + EXPERIMENT["arms"][1:]
    cases = [(f"{f} missing", with_(EXPERIMENT, **{f: _MISSING})) for f in ("experiment_id", "salt", "arms")]
    cases += [(n, with_(EXPERIMENT, **c)) for n, c in (
        ("version not higher", {"version": 1}), ("version zero", {"version": 0}), ("version negative", {"version": -5}),
        ("version huge", {"version": 10 ** 30}), ("version 2**63", {"version": 2 ** 63}), ("version NaN", {"version": NAN}),
        ("version fraction", {"version": 2.5}), ("version list", {"version": [2]}), ("version null", {"version": None}),
        ("id of another experiment", {"experiment_id": "other"}), ("id empty", {"experiment_id": ""}),
        ("id with a slash", {"experiment_id": "a/b"}), ("id surrogate", {"experiment_id": SURROGATE}),
        ("salt empty", {"salt": ""}), ("salt surrogate", {"salt": SURROGATE}), ("salt null", {"salt": None}),
        ("traffic_share above 1", {"traffic_share": 1.5}), ("traffic_share negative", {"traffic_share": -0.1}),
        ("traffic_share NaN", {"traffic_share": NAN}), ("traffic_share Infinity", {"traffic_share": float("inf")}),
        ("traffic_share string", {"traffic_share": "all"}), ("partition_mode unknown", {"partition_mode": "odd"}),
        ("arms empty", {"arms": []}), ("arms null", {"arms": None}), ("arms object", {"arms": arm}),
        ("arm null", {"arms": [None]}), ("arms duplicated", {"arms": [arm, arm]}),
        ("arm named holdout", {"arms": arms(name="holdout")}), ("arm name empty", {"arms": arms(name="")}),
        ("arm weight zero", {"arms": arms(weight=0)}), ("arm weight negative", {"arms": arms(weight=-1)}),
        ("arm weight NaN", {"arms": arms(weight=NAN)}), ("arm weight Infinity", {"arms": arms(weight=float("inf"))}),
        ("arm threshold above 1", {"arms": arms(threshold=1.5)}), ("arm threshold NaN", {"arms": arms(threshold=NAN)}),
        ("arm threshold string", {"arms": arms(threshold="high")}),
        ("cluster threshold NaN", {"arms": arms(cluster_thresholds={"3": NAN})}),
        ("cluster threshold above 1", {"arms": arms(cluster_thresholds={"3": 7})}),
        ("cluster key not a number", {"arms": arms(cluster_thresholds={"three": 0.8})}),
        ("arm ttl negative", {"arms": arms(ttl_s=-1)}), ("arm ttl Infinity", {"arms": arms(ttl_s=float("inf"))}),
        ("arm ttl NaN", {"arms": arms(ttl_s=NAN)}), ("arm max_age Infinity", {"arms": arms(max_age_s=float("inf"))}),
        ("arm capacity zero", {"arms": arms(capacity_entries=0)}), ("arm index unknown", {"arms": arms(index_kind="tree")}),
        ("arm guard unknown", {"arms": arms(guards=["profanity"])}), ("arm canary share zero",
                                                                       {"arms": arms(canary={"threshold": 0.8, "share": 0})}),
    )]
    cases += [(name, body) for name, body, _ in UNKNOWN_FIELDS + WRONG_TYPES]
    return cases


def _experiment_with(path: tuple, value) -> dict:
    """EXPERIMENT with ``value`` set at ``path`` (keys and list indexes), parents created."""
    body = copy.deepcopy(EXPERIMENT)
    node = body
    for key in path[:-1]:
        if isinstance(node, dict) and node.get(key) is None:
            node[key] = dict(_CANARY) if key == "canary" else {}
        node = node[key]
    node[path[-1]] = value
    return body


_CANARY = {"threshold": 0.85, "share": 0.1}
# (case, body, the loc the 422 must name): a typo at every level of the config is refused by name,
# not ignored ("treshold" silently doing nothing is the worst failure of a control panel).
UNKNOWN_FIELDS = [(f"unknown field {'.'.join(map(str, loc))}", body, list(loc)) for loc, body in (
    (("treshold",), _experiment_with(("treshold",), 0.5)),
    (("arms", 0, "treshold"), _experiment_with(("arms", 0, "treshold"), 0.5)),
    (("arms", 1, "ttl_seconds"), _experiment_with(("arms", 1, "ttl_seconds"), 60)),
    (("arms", 0, "ivf_nprobes"), _experiment_with(("arms", 0, "ivf_nprobes"), 4)),
    (("arms", 0, "guard"), _experiment_with(("arms", 0, "guard"), ["negation"])),
    (("arms", 0, "cluster_threshold"), _experiment_with(("arms", 0, "cluster_threshold"), {"3": 0.9})),
    (("arms", 0, "canary", "shares"), _experiment_with(("arms", 0, "canary"), {**_CANARY, "shares": 0.2})),
    (("arms", 0, "multi", "tokn"), _experiment_with(("arms", 0, "multi"), {"tokn": 0.4})),
)]
# A number given as a string or a bool is refused, not coerced (int -> float stays accepted).
WRONG_TYPES = [(f"wrong type {'.'.join(map(str, loc))} {value!r}", _experiment_with(loc, value), list(loc))
               for loc, value in (
    (("version",), str(EXPERIMENT["version"])), (("version",), True), (("version",), float(EXPERIMENT["version"])),
    (("traffic_share",), "1"), (("traffic_share",), True), (("updated_at_ms",), "5"),
    (("arms", 0, "weight"), "2"), (("arms", 0, "weight"), True), (("arms", 0, "threshold"), "0.8"),
    (("arms", 0, "threshold"), False), (("arms", 0, "ttl_s"), "60"), (("arms", 0, "capacity_entries"), "10"),
    (("arms", 0, "ivf_nlist"), True), (("arms", 0, "invalidate_after_wrong"), "1"),
    (("arms", 0, "cluster_thresholds", "3"), "0.9"), (("arms", 0, "canary", "share"), "0.1"),
    (("arms", 0, "multi", "token"), True),
)]


def _chat_cases():
    user = {"role": "user", "content": "hello there"}
    cases = [(f"messages {n}", with_(CHAT, messages=v)) for n, v in (
        ("missing", _MISSING), ("null", None), ("string", "hello"), ("empty", []), ("object", user),
        ("of null", [None]), ("of strings", ["hello"]), ("no user message", [{"role": "system", "content": "be brief"}]),
        ("assistant only", [{"role": "assistant", "content": "hi"}]), ("unknown role only", [{"role": "wizard", "content": "hi"}]),
        ("role missing", [{"content": "hi"}]), ("role empty", [{"role": "", "content": "hi"}]),
        ("role number", [{"role": 5, "content": "hi"}]), ("role upper case", [{"role": "USER", "content": "hi"}]),
        ("content missing", [{"role": "user"}]), ("content null", [{"role": "user", "content": None}]),
        ("content empty", [{"role": "user", "content": ""}]), ("content blank", [{"role": "user", "content": "  \n"}]),
        ("content number", [{"role": "user", "content": 5}]), ("content object", [{"role": "user", "content": {"text": "hi"}}]),
        ("content list of strings", [{"role": "user", "content": ["hi"]}]),
        ("content part text null", [{"role": "user", "content": [{"type": "text", "text": None}]}]),
        ("content part text object", [{"role": "user", "content": [{"type": "text", "text": {"a": 1}}]}]),
        ("content oversized", [{"role": "user", "content": "x" * (MAX_QUERY + 1)}]),
        ("content lone surrogate", [{"role": "user", "content": SURROGATE}]),
        ("system message with a surrogate", [{"role": "system", "content": SURROGATE}, user]),
        ("last user message empty", [user, {"role": "assistant", "content": "hi"}, {"role": "user", "content": ""}]),
    )]
    cases += [(f"stream {n}", with_(CHAT, stream=v)) for n, v in
              (("string", "yes"), ("string true", "true"), ("number", 1), ("null", None), ("list", [True]))]
    cases += [("model number", with_(CHAT, model=5)), ("model object", with_(CHAT, model={"name": "m"})),
              ("user number", with_(CHAT, user=5)), ("user oversized", with_(CHAT, user="u" * 257)),
              ("temperature NaN", with_(CHAT, temperature=NAN)), ("extra field Infinity", with_(CHAT, logit_bias={"1": float("inf")})),
              ("extra field surrogate", with_(CHAT, metadata={"note": SURROGATE}))]
    return cases


def _chat_header_cases():
    return [("unit id header oversized", {"x-scache-unit-id": "u" * 257}),
            ("namespace header oversized", {"x-scache-namespace": "n" * 129}),
            ("conversation header oversized", {"x-scache-conversation-id": "c" * 257}),
            ("experiment header oversized", {"x-scache-experiment": "e" * 65}),
            ("experiment header unknown", {"x-scache-experiment": "nope"}),
            ("user scope without user", {"x-scache-scope": "user"})]


def _matrix():
    """(case id, method, path, headers, body bytes): every request the sweep sends, all bad."""
    rows = []
    posts = {"/v1/lookup": (LOOKUP, _lookup_cases()), "/v1/store": (STORE, _store_cases()),
             "/v1/store/batch": ({"items": [STORE]}, _batch_cases()), "/v1/feedback": (FEEDBACK, _feedback_cases()),
             "/v1/chat/completions": (CHAT, _chat_cases())}
    for path, (base, cases) in posts.items():
        rows += [(f"{path} {n}", "POST", path, JSON, b) for n, b in _body_cases(base) + _literal(cases)]
        rows += [(f"{path} {n}", "POST", path, h, encoded(base)) for n, h in (
            ("text/plain", {"content-type": "text/plain"}), ("form", {"content-type": "application/x-www-form-urlencoded"}),
            ("no content type", {}))]
    rows += [(f"chat {n}", "POST", "/v1/chat/completions", {**JSON, **h}, encoded(CHAT)) for n, h in _chat_header_cases()]
    purge = "/v1/admin/namespaces/default/purge"
    rows += [(f"purge {n}", "POST", purge, {**JSON, **AUTH}, b) for n, b in _body_cases(PURGE) + _literal(_purge_cases())]
    put = f"/v1/admin/experiments/{EXPERIMENT['experiment_id']}"
    rows += [(f"put {n}", "PUT", put, {**JSON, **AUTH}, b) for n, b in _body_cases(EXPERIMENT) + _literal(_experiment_cases())]
    rows += [(f"put to another id", "PUT", "/v1/admin/experiments/other", {**JSON, **AUTH}, encoded(EXPERIMENT)),
             ("put to a long id", "PUT", "/v1/admin/experiments/" + "e" * 5000, {**JSON, **AUTH}, encoded(EXPERIMENT)),
             ("put to an encoded slash", "PUT", "/v1/admin/experiments/threshold-ab%2Fx", {**JSON, **AUTH}, encoded(EXPERIMENT))]
    for name, headers in (("no token", {}), ("empty bearer", {"authorization": "Bearer "}),
                          ("bearer only", {"authorization": "Bearer"}), ("basic scheme", {"authorization": f"Basic {TOKEN}"}),
                          ("wrong token", {"authorization": "Bearer wrong"}), ("token prefix", {"authorization": f"Bearer {TOKEN[:-1]}"}),
                          ("token with suffix", {"authorization": f"Bearer {TOKEN}x"}),
                          ("non-ascii token", {"authorization": "Bearer s\u00e9cret".encode("latin-1")})):
        rows += [(f"purge {name}", "POST", purge, {**JSON, **headers}, encoded(PURGE)),
                 (f"delete {name}", "DELETE", "/v1/admin/namespaces/default", headers, b""),
                 (f"put {name}", "PUT", put, {**JSON, **headers}, encoded(EXPERIMENT))]
    for name, namespace in (("oversized", "n" * 129), ("very long", "n" * 5000), ("empty", "")):
        rows += [(f"delete namespace {name}", "DELETE", f"/v1/admin/namespaces/{namespace}", AUTH, b""),
                 (f"purge namespace {name}", "POST", f"/v1/admin/namespaces/{namespace}/purge", {**JSON, **AUTH}, encoded(PURGE))]
    return rows


MATRIX = _matrix()

# Odd but valid: (case id, method, path, headers, body) answered 200 and storing nothing new.
ACCEPTED = [
    ("chat content parts without text: an image alone bypasses the cache", "POST", "/v1/chat/completions", JSON,
     encoded(with_(CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]))),
    ("chat content as text parts", "POST", "/v1/chat/completions", JSON,
     encoded(with_(CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": "parts question"}]}]))),
    ("chat unknown role before the user", "POST", "/v1/chat/completions", JSON,
     encoded(with_(CHAT, messages=[{"role": "wizard", "content": "x"}, {"role": "user", "content": "wizard question"}]))),
    ("chat unknown fields pass through", "POST", "/v1/chat/completions", JSON,
     encoded(with_(CHAT, temperature=0.2, metadata={"a": 1}, messages=[{"role": "user", "content": "extra question", "name": "bob"}]))),
    ("lookup with a blank unit id", "POST", "/v1/lookup", JSON, encoded(with_(LOOKUP, unit_id=" "))),
    ("lookup with control characters", "POST", "/v1/lookup", JSON, encoded(with_(LOOKUP, query="tab\there\x00nul\x1bEsc"))),
    ("lookup with a scope at its limit", "POST", "/v1/lookup", JSON, encoded(with_(LOOKUP, scope="s" * 256))),
] + [(f"delete namespace {n}", "DELETE", f"/v1/admin/namespaces/{p}", AUTH, b"") for n, p in (
    ("with an encoded slash", "a%2Fb"), ("NUL", "%00"), ("space", "%20"), ("invalid utf-8", "%FF"),
    ("encoded surrogate", "%ED%A0%80"), ("unicode", "caf%C3%A9"))] + [
    (f"purge namespace {n}", "POST", f"/v1/admin/namespaces/{p}/purge", {**JSON, **AUTH}, encoded(PURGE)) for n, p in (
        ("with an encoded slash", "a%2Fb"), ("NUL", "%00"), ("invalid utf-8", "%FF"))]


# -- the app ----------------------------------------------------------------------------

def make_app(minilm_embedder, snapshot_dir, upstream_port: int):
    settings = Settings(cache={"max_query_chars": MAX_QUERY, "max_answer_chars": MAX_ANSWER},
                        service={"admin_token": TOKEN, "upstream_url": f"http://127.0.0.1:{upstream_port}/v1",
                                 "open_access": True})
    return create_app(build_components(settings, RecordingPublisher(), minilm_embedder,
                                       control_publisher=ControlRecorder(),
                                       persistence=Persistence(snapshot_dir)))


def entry_count(client) -> int:
    return sum(len(p) for p in client.app.state.components.cache.partitions())


def seed(client) -> None:
    for query, answer, namespace in SEEDED:
        response = client.post("/v1/store", json={"query": query, "answer": answer, "unit_id": "seed",
                                                  "namespace": namespace})
        assert response.status_code == 200 and response.json()["stored"], response.text


def assert_seeded_served(client) -> None:
    for query, answer, namespace in SEEDED:
        body = client.post("/v1/lookup", json={"query": query, "unit_id": "seed", "namespace": namespace}).json()
        assert body["hit"] and body["answer"] == answer, body
    health = client.get("/healthz")
    assert health.status_code == 200 and health.json()["status"] == "ok"


@pytest.fixture(scope="module")
def upstream():
    with Upstream() as server:
        yield server


@pytest.fixture(scope="module")
def api(minilm_embedder, upstream, tmp_path_factory):
    app = make_app(minilm_embedder, tmp_path_factory.mktemp("sweep") / "snap", upstream.port)
    with TestClient(app, raise_server_exceptions=False) as client:
        seed(client)
        yield client


def send(client, method, path, headers, body):
    return client.request(method, path, headers=headers, content=body or None)


def assert_refused(response, case) -> None:
    assert 400 <= response.status_code < 500, f"{case}: {response.status_code} {response.text[:300]}"
    error = response.json().get("error")
    if error is not None:  # the OpenAI-compatible routes answer in OpenAI's shape
        assert error["message"].strip() and error["type"] and "param" in error and "code" in error, (case, error)
        return
    detail = response.json().get("detail")
    if isinstance(detail, list):  # validation errors: each says where and what
        assert detail and all(isinstance(e, dict) and e.get("msg") and "loc" in e for e in detail), (case, detail)
    else:
        assert isinstance(detail, str) and detail.strip(), (case, response.text[:300])


@pytest.mark.parametrize("case, method, path, headers, body", MATRIX, ids=[row[0] for row in MATRIX])
def test_bad_input_is_refused_with_a_reason(api, case, method, path, headers, body):
    before = entry_count(api)
    response = send(api, method, path, headers, body)
    assert_refused(response, case)
    assert entry_count(api) == before, case  # nothing stored, nothing removed


@pytest.mark.parametrize("case, method, path, headers, body", ACCEPTED, ids=[row[0] for row in ACCEPTED])
def test_odd_but_valid_input_is_served(api, case, method, path, headers, body):
    before = entry_count(api)
    response = send(api, method, path, headers, body)
    assert response.status_code == 200, f"{case}: {response.status_code} {response.text[:300]}"
    if method == "DELETE" or "purge" in path:
        assert response.json()["removed"] == 0 and entry_count(api) == before  # no such namespace


def test_a_namespace_with_a_slash_can_be_cleared_and_purged(api):
    before = entry_count(api)
    store = {"query": "Where is the branch?", "answer": "On Main Street.", "unit_id": "u", "namespace": "shop/eu"}
    assert api.post("/v1/store", json=store).json()["stored"]
    purged = api.post("/v1/admin/namespaces/shop%2Feu/purge", json={"query": store["query"]}, headers=AUTH)
    assert purged.status_code == 200 and purged.json() == {"namespace": "shop/eu", "removed": 1}, purged.text
    assert api.post("/v1/store", json=store).json()["stored"]
    cleared = api.delete("/v1/admin/namespaces/shop%2Feu", headers=AUTH)
    assert cleared.status_code == 200 and cleared.json() == {"namespace": "shop/eu", "removed": 1}, cleared.text
    assert entry_count(api) == before


def test_after_the_whole_sweep_nothing_is_lost(minilm_embedder, upstream, tmp_path):
    snapshot_dir = tmp_path / "snap"
    with TestClient(make_app(minilm_embedder, snapshot_dir, upstream.port), raise_server_exceptions=False) as client:
        seed(client)
        seeded = entry_count(client)
        statuses = {send(client, *row[1:]).status_code for row in MATRIX}
        assert all(400 <= s < 500 for s in statuses), statuses
        assert entry_count(client) == seeded
        assert_seeded_served(client)
    # The write-ahead log and snapshot hold exactly what was accepted: a restart serves it.
    with TestClient(make_app(minilm_embedder, snapshot_dir, upstream.port), raise_server_exceptions=False) as client:
        assert entry_count(client) == seeded
        assert_seeded_served(client)


# -- experiment configs: closed and strict, everywhere they come from ----------------------

def in_force(client) -> dict:
    """The configs in force, as GET /v1/experiments shows them, by experiment id."""
    response = client.get("/v1/experiments")
    assert response.status_code == 200, response.text
    return {e["experiment_id"]: e for e in response.json()["experiments"]}


@pytest.mark.parametrize("case, body, loc", UNKNOWN_FIELDS + WRONG_TYPES,
                         ids=[row[0] for row in UNKNOWN_FIELDS + WRONG_TYPES])
def test_a_put_with_an_unknown_field_or_a_wrong_type_names_it_and_changes_nothing(api, case, body, loc):
    before = in_force(api)
    response = api.put(f"/v1/admin/experiments/{EXPERIMENT['experiment_id']}", content=encoded(body),
                       headers={**JSON, **AUTH})
    assert response.status_code == 422, f"{case}: {response.status_code} {response.text[:300]}"
    assert loc in [e["loc"] for e in response.json()["detail"]], response.text[:500]
    assert in_force(api) == before  # config and version unchanged


def test_a_put_with_ints_for_float_fields_is_accepted(minilm_embedder, upstream, tmp_path):
    body = _experiment_with(("arms", 0, "threshold"), 1)
    body["arms"][0].update(weight=3, ttl_s=600, canary={"threshold": 0, "share": 1})
    body["traffic_share"] = 1
    with TestClient(make_app(minilm_embedder, tmp_path / "snap", upstream.port), raise_server_exceptions=False) as client:
        response = client.put(f"/v1/admin/experiments/{EXPERIMENT['experiment_id']}", json=body, headers=AUTH)
        assert response.status_code == 200 and response.json()["version"] == EXPERIMENT["version"], response.text
        arm = in_force(client)[EXPERIMENT["experiment_id"]]["arms"][0]
    assert (arm["threshold"], arm["weight"], arm["ttl_s"], arm["canary"]["threshold"]) == (1.0, 3.0, 600.0, 0.0)


@pytest.mark.parametrize("case, body, loc", UNKNOWN_FIELDS[:3] + WRONG_TYPES[:2],
                         ids=[row[0] for row in UNKNOWN_FIELDS[:3] + WRONG_TYPES[:2]])
def test_the_experiments_file_refuses_unknown_fields_and_wrong_types(tmp_path, case, body, loc):
    path = tmp_path / "experiments.yaml"
    path.write_text(yaml.safe_dump({"experiments": [body]}))
    with pytest.raises(ValueError, match=re.escape(".".join(map(str, loc)) + ":")):
        load_experiments(path)


def test_the_experiments_file_as_shipped_still_loads():
    assert load_experiments(Settings().experiments_file)["threshold-ab"].arms


def _control_record(value: bytes, offset: int):
    return SimpleNamespace(key=f"threshold-ab/v{offset}/m{offset}".encode(), value=value, offset=offset)


def test_a_control_message_with_an_unknown_field_or_wrong_type_is_counted_malformed_not_applied():
    registry = ExperimentRegistry.from_file(Settings().experiments_file)
    listener = ControlListener(Settings().kafka, on_record=registry.apply_record)
    good = ControlMessage(experiment=ExperimentConfig.model_validate(EXPERIMENT), actor="t")
    envelope = json.loads(good.model_dump_json())
    bad = [{**envelope, "experiment": body} for _, body, _ in UNKNOWN_FIELDS + WRONG_TYPES]
    bad.append({**envelope, "acter": "typo"})  # the envelope is closed too
    before = registry.get("threshold-ab").model_dump()
    for offset, message in enumerate(bad):
        listener.handle(_control_record(json.dumps(message).encode(), offset), TopicPartition("control", 0))
    stats = listener.stats()
    assert (stats["malformed"], stats["handler_errors"]) == (len(bad), 0), stats
    assert registry.get("threshold-ab").model_dump() == before
    # the listener goes on: a valid message after them is applied
    listener.handle(_control_record(good.model_dump_json().encode(), len(bad)), TopicPartition("control", 0))
    assert registry.get("threshold-ab").version == EXPERIMENT["version"]
    with pytest.raises(ValueError, match=r"experiment\.arms\.0\.treshold: Extra inputs"):
        parse_control(json.dumps(bad[1]).encode())
