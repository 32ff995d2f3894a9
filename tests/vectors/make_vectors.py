#!/usr/bin/env python3
"""Writes the conformance vectors (tests/vectors/*.json).

The vectors are the specification; this script is only the pen. Every
expectation below is written by hand from the semantics in the README; the exact
delays are computed here, independently of the policy, from the documented draw
`floor(entropy * (ceiling + 1) / 2^64)`, `ceiling = min(max, base * 2^(retry-1))`.

    python3 tests/vectors/make_vectors.py          # rewrite the files
    python3 tests/vectors/make_vectors.py --check  # fail if they differ or break the style rules
"""
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = 1_764_460_800_000  # 2025-11-30T00:00:00Z, a Sunday: every case's clock starts here
MID = 1 << 63  # the default entropy
MAX = (1 << 64) - 1


def hexu(n):
    return "0x%016x" % n


def jitter(entropy, retry, base=1000, cap=30000):
    ceiling = min(cap, base * 2 ** (max(retry, 1) - 1))
    return (entropy * (ceiling + 1)) >> 64


# ---------- building blocks ----------

def failure(status=None, transport=None, rpc=None, tool_error=False, upstream=None, headers=(), body="", structured=None,
            session=False, delivery=None):
    if status is not None:
        kind = {"http-status": status}
    elif transport is not None:
        kind = {"transport": transport}
    elif rpc is not None:
        kind = {"protocol-error": rpc}
    else:
        assert tool_error
        kind = {"tool-error": upstream}
    out = {"kind": kind}
    if headers:
        out["headers"] = [list(h) for h in headers]
    if body:
        out["body"] = body
    if structured is not None:
        out["structured-content"] = structured if isinstance(structured, str) else json.dumps(structured)
    if session:
        out["session-id-sent"] = True
    if delivery is not None:
        out["delivery"] = delivery
    return out


def fail(**kw):
    return {"failure": failure(**kw)}


SUCCESS = "success"


def begin(tool, key=None, hints=None, expect=None, now=None):
    call = {"tool": tool}
    if key is not None:
        call["idempotency-key"] = key
    if hints is not None:
        call["hints"] = hints
    step = {"op": "begin-call", "call": call}
    if now is not None:
        step["now-ms"] = now
    if expect is not None:
        step["expect"] = expect
    return step


def sent(call_id, **fields):
    return {"ok": {"send": dict({"call-id": call_id}, **fields)}}


def outcome(call_id, what, expect=None, entropy=None, now=None, attempt=None, time_left=None):
    step = {"op": "record-outcome", "call-id": call_id, "outcome": what}
    if time_left is not None:
        step["time-left-ms"] = time_left
    if attempt is not None:
        step["attempt"] = attempt
    if entropy is not None:
        step["entropy"] = hexu(entropy)
    if now is not None:
        step["now-ms"] = now
    if expect is not None:
        step["expect"] = expect
    return step


def dashed(fields):
    """Python keyword arguments name WIT fields with _ for -."""
    return {k.replace("_", "-"): v for k, v in fields.items()}


def decision(action, cls=None, **fields):
    d = {"action": action}
    if cls:
        d["class"] = cls
    d.update(dashed(fields))
    return {"ok": d}


def retry(delay=None, attempt=None, key="any", cls=None, reconnect=None, **fields):
    plan = {}
    if reconnect is not None:
        plan["reconnect"] = reconnect
    if delay is not None:
        plan["delay-ms"] = delay
    if attempt is not None:
        plan["attempt"] = attempt
    if key != "any":
        plan["idempotency-key"] = key
    return decision({"retry": plan}, cls, **fields)


def replan(contains=None, cls=None, **fields):
    return decision({"replan": {"$contains": contains}} if contains else {"replan": {"$contains": ""}}, cls, **fields)


def escalate(reason, cls=None, **extra):
    e = {"reason": reason}
    e.update(dashed(extra))
    return decision({"escalate": e}, cls)


def succeed(note=None, cls=None):
    return decision({"succeed": note if note is None else {"$contains": note}}, cls)


def report(**fields):
    return {"op": "report", "expect": dashed(fields)}


def classify(fail_fields, expect, now=None):
    step = {"op": "classify", "failure": failure(**fail_fields), "expect": expect}
    if now is not None:
        step["now-ms"] = now
    return step


def case(description, steps, config=None, comment=None):
    c = {"description": description}
    if comment:
        c["comment"] = comment
    if config is not None:
        c["config"] = config
    c["steps"] = steps
    return c


READ = {"read-only": True}
REFUND_TOOLS = {
    "lookup_order": {"effect": "read"},
    "issue_refund": {"effect": "write"},
    "list_refunds": {"effect": "read"},
    "delete_asset": {"effect": "delete"},
    "upload_asset": {"effect": "write"},
}
TOOLS = {"tools": REFUND_TOOLS}


# ---------- classify.json ----------

def classify_cases():
    cases = []
    table = [
        (408, "transient"), (500, "transient"), (502, "transient"), (503, "transient"), (504, "transient"),
        (429, "throttled"), (529, "throttled"),
        (400, "deterministic"), (404, "deterministic"), (409, "deterministic"), (410, "deterministic"),
        (422, "deterministic"), (418, "deterministic"),
        (401, "permission"), (403, "permission"),
        (200, "unclassified"), (302, "unclassified"), (501, "unclassified"), (505, "unclassified"),
        (600, "unclassified"), (0, "unclassified"),
    ]
    for status, cls in table:
        cases.append(case(f"HTTP {status} is {cls}", [classify({"status": status}, {"class": cls, "hint-ms": None})],
                          comment="semantics 1-5: status codes by RFC 9110 / RFC 6585; 529 is Anthropic's overloaded"))
    for transport in ["timeout", "connection-reset", "connection-refused", "stream-closed"]:
        cases.append(case(f"transport {transport} is transient", [classify({"transport": transport}, {"class": "transient"})]))
    cases.append(case("transport other is unclassified", [classify({"transport": "other"}, {"class": "unclassified", "reason": {"$contains": "probable bug"}})]))
    for code, cls in [(-32602, "deterministic"), (-32601, "deterministic"), (-32603, "transient"), (-32700, "unclassified"),
                      (-32600, "unclassified"), (-32042, "permission"), (-32001, "transient")]:
        cases.append(case(f"JSON-RPC {code} is {cls}", [classify({"rpc": code}, {"class": cls})]))
    cases.append(case("isError result without upstream status is deterministic", [classify({"tool_error": True}, {"class": "deterministic"})]))
    cases.append(case("isError result reporting upstream 503 is transient", [classify({"tool_error": True, "upstream": 503}, {"class": "transient"})]))
    cases.append(case("isError result reporting upstream 403 is permission", [classify({"tool_error": True, "upstream": 403}, {"class": "permission"})]))
    cases.append(case("status-overrides turn 409 transient", [classify({"status": 409}, {"class": "transient", "reason": {"$contains": "status-overrides"}})],
                      config={"status-overrides": {"409": "transient"}}))
    cases.append(case("x-should-retry true makes a 400 transient", [classify({"status": 400, "headers": [("x-should-retry", "true")]}, {"class": "transient"})]))
    cases.append(case("x-should-retry false keeps a 503 transient and says the server forbids a retry",
                      [classify({"status": 503, "headers": [("X-Should-Retry", "false")]}, {"class": "transient", "server-says-retry": False})],
                      comment="Stainless SDKs (openai-python _base_client.py _should_retry): the header is the server's verdict"))
    cases.append(case("x-should-retry false keeps a 429 throttled", [classify({"status": 429, "headers": [("x-should-retry", "false")]}, {"class": "throttled", "server-says-retry": False})]))
    cases.append(case("x-should-retry true leaves a 403 permission", [classify({"status": 403, "headers": [("x-should-retry", "true")]}, {"class": "permission"})]))
    cases.append(case("an AWS throttling code in x-amzn-ErrorType makes a 400 throttled",
                      [classify({"status": 400, "headers": [("x-amzn-ErrorType", "ThrottlingException:http://internal.amazon.com/coral/com.amazon.coral.availability/")]},
                                {"class": "throttled", "rule": "aws-error-code"})], comment="botocore retries/standard.py: throttled error codes, whatever the status"))
    cases.append(case("an AWS throttling code in the body makes a 400 throttled",
                      [classify({"status": 400, "body": json.dumps({"__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException", "message": "slow down"})},
                                {"class": "throttled", "rule": "aws-error-code"})], comment="botocore retries/standard.py"))
    cases.append(case("an AWS transient code in the body makes a 400 transient",
                      [classify({"status": 400, "body": json.dumps({"code": "RequestTimeout"})}, {"class": "transient", "rule": "aws-error-code"})], comment="botocore retries/standard.py"))
    cases.append(case("S3 SlowDown on a 503 is throttled", [classify({"status": 503, "body": json.dumps({"Code": "SlowDown"})}, {"class": "throttled"})],
                      comment="Amazon S3 error responses"))
    cases.append(case("an AWS code that is neither throttling nor transient changes nothing",
                      [classify({"status": 400, "body": json.dumps({"__type": "ValidationException"})}, {"class": "deterministic", "rule": "http-status"})]))
    for code, cls in [(14, "transient"), (8, "throttled"), (4, "transient"), (7, "permission"), (16, "permission"), (3, "deterministic"), (12, "unclassified")]:
        cases.append(case(f"grpc-status {code} is {cls}", [classify({"status": 500, "headers": [("grpc-status", str(code))]}, {"class": cls, "rule": "grpc-status"})],
                          comment="gRPC status codes (grpc.io): 14 UNAVAILABLE, 8 RESOURCE_EXHAUSTED, 4 DEADLINE_EXCEEDED, 7 PERMISSION_DENIED, 16 UNAUTHENTICATED, 3 INVALID_ARGUMENT, 12 UNIMPLEMENTED"))
    cases.append(case("x-envoy-overloaded makes a 503 throttled", [classify({"status": 503, "headers": [("x-envoy-overloaded", "true")]}, {"class": "throttled", "rule": "x-envoy-overloaded"})],
                      comment="Envoy router: x-envoy-overloaded is set when a request is shed by overload or circuit breaking"))
    cases.append(case("a 413 with Retry-After is throttled", [classify({"status": 413, "headers": [("retry-after", "5")]}, {"class": "throttled", "hint-ms": 5000, "rule": "413-retry-after"})],
                      comment="RFC 9110 15.5.14: a temporary condition carries Retry-After"))
    cases.append(case("a 413 without Retry-After is deterministic", [classify({"status": 413}, {"class": "deterministic"})]))
    cases.append(case("garbage x-should-retry is a header problem and changes nothing",
                      [classify({"status": 503, "headers": [("x-should-retry", "perhaps")]},
                                {"class": "transient", "header-problems": [{"name": "x-should-retry", "value": "perhaps"}]})]))
    return cases


# ---------- hints.json ----------

def hints_cases():
    def hint(description, headers, ms, source, status=429, comment=None):
        expect = {"class": "throttled" if status == 429 else "transient", "hint-ms": ms, "hint-source": source}
        return case(description, [classify({"status": status, "headers": headers}, expect)], comment=comment)

    cases = [
        hint("Retry-After delay-seconds", [("Retry-After", "2")], 2000, "retry-after"),
        hint("Retry-After decimal seconds round up to ms", [("retry-after", "1.0005")], 1001, "retry-after"),
        hint("Retry-After IMF-fixdate one minute ahead", [("retry-after", "Sun, 30 Nov 2025 00:01:00 GMT")], 60000, "retry-after", status=503),
        hint("Retry-After RFC 850 date", [("retry-after", "Sunday, 30-Nov-25 00:00:30 GMT")], 30000, "retry-after", status=503),
        hint("Retry-After asctime date", [("retry-after", "Sun Nov 30 00:00:10 2025")], 10000, "retry-after", status=503),
        hint("Retry-After date in the past is a zero hint", [("retry-after", "Sat, 29 Nov 2025 23:00:00 GMT")], 0, "retry-after"),
        hint("retry-after-ms takes precedence over Retry-After", [("retry-after", "9"), ("retry-after-ms", "250")], 250, "retry-after-ms"),
        hint("RateLimit t of an exhausted policy", [("RateLimit", '"default";r=0;t=30')], 30000, "ratelimit",
             comment="draft-ietf-httpapi-ratelimit-headers: t is seconds until quota returns"),
        hint("RateLimit longest t among exhausted policies", [("ratelimit", '"burst";r=0;t=3, "daily";t=70')], 70000, "ratelimit"),
        hint("Retry-After takes precedence over RateLimit", [("ratelimit", '"a";r=0;t=30'), ("retry-after", "4")], 4000, "retry-after"),
        hint("OpenAI Go durations: the later exhausted reset wins",
             [("x-ratelimit-reset-requests", "6m0s"), ("x-ratelimit-reset-tokens", "12ms")], 360000, "x-ratelimit-reset-requests"),
        hint("OpenAI limit with quota left is ignored",
             [("x-ratelimit-reset-requests", "1s"), ("x-ratelimit-remaining-requests", "3"), ("x-ratelimit-reset-tokens", "1h2m3.5s"),
              ("x-ratelimit-remaining-tokens", "0")], 3723500, "x-ratelimit-reset-tokens"),
        hint("Anthropic RFC 3339 reset", [("anthropic-ratelimit-requests-reset", "2025-11-30T00:00:05Z")], 5000, "anthropic-ratelimit-requests-reset"),
        hint("Anthropic reset with an offset", [("anthropic-ratelimit-tokens-reset", "2025-11-30T05:30:20+05:30")], 20000, "anthropic-ratelimit-tokens-reset"),
        hint("X-RateLimit-Reset as seconds from now", [("X-RateLimit-Reset", "20")], 20000, "x-ratelimit-reset"),
        hint("X-RateLimit-Reset as Unix seconds", [("x-ratelimit-reset", str(START // 1000 + 90))], 90000, "x-ratelimit-reset"),
        hint("RateLimit-Reset as Unix ms", [("ratelimit-reset", str(START + 1500))], 1500, "ratelimit-reset"),
    ]
    cases.append(case("RateLimit with quota left gives no hint",
                      [classify({"status": 429, "headers": [("ratelimit", '"a";r=5;t=30')]}, {"class": "throttled", "hint-ms": None, "header-problems": []})]))
    cases.append(case("garbage Retry-After is reported and ignored",
                      [classify({"status": 429, "headers": [("retry-after", "soon")]},
                                {"class": "throttled", "hint-ms": None,
                                 "header-problems": [{"name": "retry-after", "value": "soon", "problem": {"$contains": "HTTP-date"}}]})]))
    cases.append(case("garbage Retry-After falls through to the next header",
                      [classify({"status": 429, "headers": [("retry-after", "-1"), ("ratelimit", '"a";r=0;t=5')]},
                                {"hint-ms": 5000, "hint-source": "ratelimit", "header-problems": [{"name": "retry-after"}]})]))
    cases.append(case("malformed RateLimit is reported",
                      [classify({"status": 429, "headers": [("ratelimit", "r=;t")]}, {"hint-ms": None, "header-problems": [{"name": "ratelimit"}]})]))
    cases.append(case("malformed Go duration is reported",
                      [classify({"status": 429, "headers": [("x-ratelimit-reset-requests", "6 minutes")]},
                                {"hint-ms": None, "header-problems": [{"name": "x-ratelimit-reset-requests", "problem": {"$contains": "Go duration"}}]})]))
    cases.append(case("RateLimit split over two fields gives the same hint as joined",
                      [classify({"status": 429, "headers": [("RateLimit", '"burst";r=5;t=1'), ("RateLimit", '"daily";r=0;t=20')]}, {"hint-ms": 20000, "hint-source": "ratelimit"}),
                       classify({"status": 429, "headers": [("RateLimit", '"burst";r=5;t=1, "daily";r=0;t=20')]}, {"hint-ms": 20000, "hint-source": "ratelimit"})],
                      comment="RFC 9110 5.3: a list may span several field lines; RFC 9651 3.1"))
    cases.append(case("x-amz-retry-after is in milliseconds", [classify({"status": 503, "headers": [("x-amz-retry-after", "1500")]}, {"hint-ms": 1500, "hint-source": "x-amz-retry-after"})],
                      comment="AWS SDKs' retry behaviour (smithy-rs AwsErrorCodeClassifier)"))
    cases.append(case("grpc-retry-pushback-ms is a hint in milliseconds", [classify({"status": 503, "headers": [("grpc-retry-pushback-ms", "250")]}, {"hint-ms": 250, "hint-source": "grpc-retry-pushback-ms"})],
                      comment="gRPC proposal A6, gRPC Retry Design: server pushback"))
    cases.append(case("a negative grpc-retry-pushback-ms forbids a retry", [classify({"status": 503, "headers": [("grpc-retry-pushback-ms", "-1")]},
                      {"hint-ms": None, "server-says-retry": False, "header-problems": [{"name": "grpc-retry-pushback-ms"}]})], comment="gRPC proposal A6"))
    cases.append(case("Retry-After with UTC instead of GMT and a one-digit day", [classify({"status": 503, "headers": [("retry-after", "Sun, 30 Nov 2025 00:01:00 UTC")]}, {"hint-ms": 60000}),
                      classify({"status": 503, "headers": [("retry-after", "Mon, 1 Dec 2025 00:00:00 GMT")]}, {"hint-ms": 86400000})],
                      comment="lenient dates as Python's email.utils.parsedate_to_datetime reads them (openai-python, anthropic-sdk-python)"))
    cases.append(case("a 35-digit Retry-After is a header problem, not a wait",
                      [classify({"status": 429, "headers": [("retry-after", "9" * 35)]},
                                {"hint-ms": None, "header-problems": [{"name": "retry-after", "problem": {"$contains": "max-plausible-hint-ms"}}]})]))
    cases.append(case("a Retry-After of two years is implausible and the next header is read",
                      [classify({"status": 429, "headers": [("retry-after", str(2 * 365 * 86400)), ("ratelimit", '"a";r=0;t=5')]},
                                {"hint-ms": 5000, "hint-source": "ratelimit"})]))
    cases.append(case("max-plausible-hint-ms is configurable",
                      [classify({"status": 429, "headers": [("retry-after", "7200")]}, {"hint-ms": None, "header-problems": [{"name": "retry-after"}]})],
                      config={"max-plausible-hint-ms": 3600000}))
    cases.append(case("a header value with control characters is cut to one line",
                      [classify({"status": 429, "headers": [("retry-after", "a\nb\u0000c")]},
                                {"header-problems": [{"name": "retry-after", "value": "a b c"}]})]))
    return cases


# ---------- backoff.json ----------

def backoff_cases():
    e = 0x9E3779B97F4A7C15
    cases = []
    seq = [{"op": "next-delay", "retry": r, "entropy": hexu(e), "expect": jitter(e, r)} for r in range(1, 8)]
    cases.append(case("full-jitter delays for retries 1 to 7 with one entropy value", seq,
                      comment="ceilings 1000, 2000, 4000, 8000, 16000, 30000 (cap), 30000"))
    cases.append(case("zero entropy draws zero", [{"op": "next-delay", "retry": 3, "entropy": hexu(0), "expect": 0}]))
    cases.append(case("maximum entropy draws the ceiling", [{"op": "next-delay", "retry": 3, "entropy": hexu(MAX), "expect": 4000}]))
    cases.append(case("the cap bounds the ceiling", [{"op": "next-delay", "retry": 20, "entropy": hexu(MAX), "expect": 30000}]))
    cases.append(case("retry 0 is read as retry 1", [{"op": "next-delay", "retry": 0, "entropy": hexu(MAX), "expect": 1000}]))
    cases.append(case("retry u32::MAX saturates at the cap", [{"op": "next-delay", "retry": 4294967295, "entropy": hexu(MAX), "expect": 30000}]))
    cases.append(case("the hint is a floor above the draw", [{"op": "next-delay", "retry": 1, "hint-ms": 3000, "entropy": hexu(MAX), "expect": 3000}]))
    cases.append(case("a draw above the hint wins", [{"op": "next-delay", "retry": 5, "hint-ms": 3000, "entropy": hexu(MAX), "expect": 16000}]))
    cases.append(case("the hint is honoured above the cap", [{"op": "next-delay", "retry": 1, "hint-ms": 45000, "entropy": hexu(0), "expect": 45000}]))
    cases.append(case("AWS-like base 50 ms and cap 20 s",
                      [{"op": "next-delay", "retry": r, "entropy": hexu(MID), "expect": jitter(MID, r, 50, 20000)} for r in (1, 2, 10, 11)],
                      config={"base-delay-ms": 50, "max-delay-ms": 20000}))
    return cases


# ---------- keys.json ----------

def fnv1a_128(data):
    h = 0x6C62272E07BB014262B821756295C58D
    for b in data:
        h ^= b
        h = (h * 0x0000000001000000000000000000013B) % (1 << 128)
    return h


def key_of(run_id, action_id):
    return "ar1-%032x" % fnv1a_128(run_id.encode() + b"\0" + action_id.encode())


def keys_cases():
    return [
        case("the key is FNV-1a-128 of run id, NUL, action id",
             [{"op": "derive-idempotency-key", "run-id": "CASE-5016", "action-id": "step-3", "expect": key_of("CASE-5016", "step-3")}]),
        case("the same inputs give the same key twice",
             [{"op": "derive-idempotency-key", "run-id": "r", "action-id": "a", "expect": key_of("r", "a")},
              {"op": "derive-idempotency-key", "run-id": "r", "action-id": "a", "expect": key_of("r", "a")}]),
        case("the separator keeps run and action apart",
             [{"op": "derive-idempotency-key", "run-id": "ab", "action-id": "c", "expect": key_of("ab", "c")},
              {"op": "derive-idempotency-key", "run-id": "a", "action-id": "bc", "expect": key_of("a", "bc")}]),
        case("non-ASCII ids hash their UTF-8 bytes",
             [{"op": "derive-idempotency-key", "run-id": "रन", "action-id": "é", "expect": key_of("रन", "é")}]),
    ]


def fix_key_hashes():
    # The FNV offset basis above is typed from the spec; check it once here.
    assert "%032x" % fnv1a_128(b"") == "6c62272e07bb014262b821756295c58d"
    assert "%032x" % fnv1a_128(b"a") == "d228cb696f1a8caf78912b704e4a8964"


# ---------- runs-transient.json ----------

def transient_cases():
    k = key_of("run-1", "refund")
    return [
        case("a 503 on a read is retried and the model sees only the success", [
            begin("lookup_order", expect=sent(1, **{"delay-ms": 0, "effect": "read", "safe-to-repeat": True})),
            outcome(1, fail(status=503), retry(jitter(MID, 1), 2, None, "transient")),
            outcome(1, SUCCESS, succeed(None, "success")),
            report(calls=1, attempts=2, retries=1, replans=0, **{"succeeded-calls": 1, "waited-ms": jitter(MID, 1)}),
        ], config=TOOLS, comment="semantics 1"),
        case("a 429 with Retry-After 2 waits at least 2000 ms", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("Retry-After", "2")]), retry(2000, 2, cls="throttled", **{"hint-ms": 2000}), entropy=MAX),
        ], config=TOOLS, comment="semantics 8: the hint is a floor; entropy max draws 1000, the floor lifts it to 2000"),
        case("a timeout on a keyed write is retried with the same key", [
            begin("issue_refund", key=k, expect=sent(1, effect="write", **{"safe-to-repeat": True})),
            outcome(1, fail(transport="timeout"), retry(jitter(MID, 1), 2, k, "transient")),
            outcome(1, SUCCESS, succeed()),
            report(effects=[{"call-id": 1, "tool": "issue_refund", "idempotency-key": k, "status": "applied"}]),
        ], config=TOOLS, comment="semantics 6"),
        case("a timeout on an unkeyed write asks for a status check", [
            begin("issue_refund", expect=sent(1, **{"safe-to-repeat": False})),
            outcome(1, fail(transport="timeout"), decision("check-status", "transient")),
            report(**{"status-checks": 1, "retries": 0}),
        ], config=TOOLS, comment="semantics 6: the check_status step of 'Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up'"),
        case("a status check that finds the write applied succeeds without resending", [
            begin("issue_refund"),
            outcome(1, fail(transport="timeout"), decision("check-status")),
            outcome(1, {"status-check": "found"}, succeed("already applied")),
            report(attempts=1, retries=0, **{"status-checks": 1, "succeeded-calls": 1},
                   effects=[{"call-id": 1, "tool": "issue_refund", "idempotency-key": None, "status": "applied"}]),
        ], config=TOOLS, comment="semantics 7"),
        case("a status check that finds the write absent allows a resend", [
            begin("issue_refund"),
            outcome(1, fail(status=503), decision("check-status")),
            outcome(1, {"status-check": "absent"}, retry(jitter(MID, 1), 2, None)),
            outcome(1, SUCCESS, succeed()),
            report(attempts=2, retries=1, **{"status-checks": 1}, effects=[{"call-id": 1, "status": "applied"}]),
        ], config=TOOLS),
        case("a status check that cannot tell escalates", [
            begin("issue_refund"),
            outcome(1, fail(transport="connection-reset"), decision("check-status")),
            outcome(1, {"status-check": "unknown"}, escalate("status-unknown",
                    effects=[{"call-id": 1, "tool": "issue_refund", "status": "unknown"}], note={"$contains": "may have been applied"})),
        ], config=TOOLS),
        case("a 429 on an unkeyed write is retried: it was refused before it ran", [
            begin("issue_refund"),
            outcome(1, fail(status=429), retry(jitter(MID, 1), 2, None, "throttled")),
        ], config=TOOLS),
        case("a refused connection on an unkeyed write is retried: it never arrived", [
            begin("issue_refund"),
            outcome(1, fail(transport="connection-refused"), retry(jitter(MID, 1), 2, None, "transient")),
        ], config=TOOLS),
        case("a tool marked idempotent is retried without a key", [
            begin("set_status", expect=sent(1, **{"safe-to-repeat": True})),
            outcome(1, fail(transport="timeout"), retry(attempt=2)),
        ], config={"tools": {"set_status": {"effect": "write", "idempotent": True}}}),
        case("MCP idempotentHint makes an unknown tool safe to repeat", [
            begin("set_status", hints={"idempotent": True}, expect=sent(1, effect="write", **{"safe-to-repeat": True})),
            outcome(1, fail(status=502), retry(attempt=2)),
        ]),
        case("an unknown tool without hints is treated as an unkeyed write", [
            begin("mystery", expect=sent(1, effect="write", **{"safe-to-repeat": False})),
            outcome(1, fail(status=504), decision("check-status")),
        ], comment="default-effect write: the safe side (MCP's readOnlyHint defaults to false)"),
        case("a 529 overloaded is throttled and retried", [
            begin("lookup_order"),
            outcome(1, fail(status=529), retry(attempt=2, cls="throttled")),
        ], config=TOOLS),
        case("delays grow exponentially over retries of one call", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(jitter(MAX, 1), 2), entropy=MAX),
            outcome(1, fail(status=503), retry(jitter(MAX, 2), 3), entropy=MAX),
            outcome(1, fail(status=503), retry(jitter(MAX, 3), 4), entropy=MAX),
            report(**{"waited-ms": 1000 + 2000 + 4000, "waits": 3}),
        ], config=TOOLS),
        case("a JSON-RPC internal error on a read is retried", [
            begin("lookup_order"),
            outcome(1, fail(rpc=-32603), retry(attempt=2, cls="transient")),
        ], config=TOOLS),
        case("an isError result reporting upstream 503 is retried", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, upstream=503, body="vendor API unavailable"), retry(attempt=2, cls="transient")),
        ], config=TOOLS),
        case("x-should-retry false on a 503 escalates: the model cannot fix it and the server forbids a retry", [
            begin("lookup_order"),
            outcome(1, fail(status=503, headers=[("x-should-retry", "false")], body="maintenance"),
                    escalate("retry-forbidden", "transient", note={"$contains": "forbids a retry"})),
        ], config=TOOLS),
        case("x-should-retry false on a spend-cap 429 still escalates with the reset time", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("x-should-retry", "false"), ("retry-after", "62291")], body="spend cap"),
                    escalate("server-wait-too-long", "throttled", **{"resets-in-ms": 62291000})),
        ], config=TOOLS, comment="the reset time is what a person needs; x-should-retry does not hide it"),
        case("x-should-retry false on a 400 is still shown to the model", [
            begin("lookup_order"),
            outcome(1, fail(status=400, headers=[("x-should-retry", "false")], body="bad order id"), replan("bad order id", "deterministic")),
        ], config=TOOLS),
        case("the statuses seen are counted per status", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), retry(attempt=3)),
            outcome(1, fail(status=429), retry(attempt=4)),
            report(statuses=[{"status": 429, "count": 1}, {"status": 503, "count": 2}]),
        ], config=TOOLS),
    ]


# ---------- runs-deterministic.json ----------

def deterministic_cases():
    cases = []
    for status in (400, 404, 409, 422):
        cases.append(case(f"a {status} is shown to the model, not retried", [
            begin("issue_refund"),
            outcome(1, fail(status=status, body="amount must be an integer number of paise"),
                    replan(f"issue_refund failed: HTTP {status}: amount must be an integer number of paise", "deterministic")),
            report(attempts=1, retries=0, replans=1),
        ], config=TOOLS, comment="semantics 2"))
    cases += [
        case("JSON-RPC invalid params is shown to the model", [
            begin("issue_refund"),
            outcome(1, fail(rpc=-32602, body="amount: expected integer"), replan("JSON-RPC error -32602: amount: expected integer")),
        ], config=TOOLS),
        case("an isError tool result is shown to the model", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="no order CASE-9 for this customer"), replan("tool error: no order CASE-9")),
        ], config=TOOLS),
        case("the replan limit escalates the third deterministic failure", [
            begin("lookup_order"), outcome(1, fail(status=404), replan()),
            begin("lookup_order"), outcome(2, fail(status=404), replan()),
            begin("lookup_order"), outcome(3, fail(status=404), escalate("replans-spent", last_error="HTTP 404")),
            report(replans=2, escalation="replans-spent"),
        ], config=TOOLS, comment="semantics 2 and 'Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up': replan, replan, escalate"),
        case("replan limit 0 escalates the first deterministic failure", [
            begin("lookup_order"), outcome(1, fail(status=400), escalate("replans-spent")),
        ], config={"max-replans-per-run": 0}),
        case("the model's message is cut to max-message-chars", [
            begin("lookup_order"),
            outcome(1, fail(status=400, body="x" * 100), {"ok": {"action": {"replan": "lookup_order failed: HTTP 400: " + "x" * 16 + "…"}}}),
        ], config={"max-message-chars": 16}),
        case("the model's message is one line", [
            begin("lookup_order"),
            outcome(1, fail(status=422, body="line one\n  line two\r\n"), {"ok": {"action": {"replan": "lookup_order failed: HTTP 422: line one line two"}}}),
        ]),
        case("a call is over after a replan", [
            begin("lookup_order"), outcome(1, fail(status=400), replan()),
            outcome(1, fail(status=400), {"err": {"call-finished": 1}}),
        ]),
    ]
    return cases


# ---------- runs-permission.json ----------

def permission_cases():
    k = key_of("run-1", "refund-1")
    return [
        case("a 403 escalates at once with its body", [
            begin("issue_refund"),
            outcome(1, fail(status=403, body="refunds above 5000 rupees need a person"),
                    escalate("permission-denied", "permission", **{"last-error": "HTTP 403: refunds above 5000 rupees need a person"})),
            report(attempts=1, retries=0, escalation="permission-denied"),
        ], config=TOOLS, comment="semantics 3"),
        case("a 401 escalates at once", [
            begin("lookup_order"), outcome(1, fail(status=401, body="token expired"), escalate("permission-denied", note={"$contains": "token expired"})),
        ], config=TOOLS),
        case("the escalation note lists the refunds already made", [
            begin("issue_refund", key=k), outcome(1, SUCCESS, succeed()),
            begin("issue_refund"), outcome(2, fail(status=403), escalate("permission-denied",
                effects=[{"call-id": 1, "tool": "issue_refund", "idempotency-key": k, "status": "applied"}],
                note={"$contains": f"1. issue_refund (call 1, key {k}): applied."})),
        ], config=TOOLS, comment="'Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up': a hand-off says which effects already happened"),
        case("reads are not listed as effects", [
            begin("lookup_order"), outcome(1, SUCCESS),
            begin("issue_refund"), outcome(2, fail(status=403), escalate("permission-denied", effects=[], note={"$contains": "No effects were made"})),
        ], config=TOOLS),
        case("a JSON-RPC URL elicitation escalates", [
            begin("lookup_order"), outcome(1, fail(rpc=-32042), escalate("permission-denied")),
        ], config=TOOLS),
        case("an escalated run accepts no more calls", [
            begin("lookup_order"), outcome(1, fail(status=403), escalate("permission-denied")),
            begin("lookup_order", expect={"err": {"run-ended": "permission-denied"}}),
        ], config=TOOLS),
    ]


# ---------- runs-semantic.json ----------

def semantic_cases():
    return [
        case("an empty result is shown to the model", [
            begin("lookup_order"),
            outcome(1, {"empty-result": "no orders for customer Hansini"},
                    replan("lookup_order returned an empty or unusable result: no orders for customer Hansini", "semantic")),
        ], config=TOOLS, comment="semantics 4: a 200 is not success until the result is usable"),
        case("empty results past the replan limit escalate", [
            begin("lookup_order"), outcome(1, {"empty-result": "[]"}, replan()),
            begin("lookup_order"), outcome(2, {"empty-result": "[]"}, replan()),
            begin("lookup_order"), outcome(3, {"empty-result": "[]"}, escalate("replans-spent", "semantic")),
        ], config=TOOLS),
        case("an empty result from a write records the write as applied", [
            begin("issue_refund"), outcome(1, {"empty-result": "no refund id returned"}, replan()),
            report(effects=[{"call-id": 1, "status": "applied"}]),
        ], config=TOOLS),
    ]


# ---------- runs-unclassified.json ----------

def unclassified_cases():
    return [
        case("a 501 escalates as a probable bug", [
            begin("lookup_order"),
            outcome(1, fail(status=501), escalate("unclassified-failure", "unclassified", note={"$contains": "probable bug"})),
        ], config=TOOLS, comment="semantics 5: never retried"),
        case("an unknown transport error escalates", [
            begin("lookup_order"), outcome(1, fail(transport="other"), escalate("unclassified-failure")),
        ], config=TOOLS),
        case("a JSON-RPC parse error escalates", [
            begin("lookup_order"), outcome(1, fail(rpc=-32700), escalate("unclassified-failure")),
        ], config=TOOLS),
        case("a 2xx reported as a failure escalates", [
            begin("lookup_order"), outcome(1, fail(status=200), escalate("unclassified-failure")),
        ], config=TOOLS),
        case("a status outside 100-599 escalates", [
            begin("lookup_order"), outcome(1, fail(status=65535), escalate("unclassified-failure")),
        ], config=TOOLS),
    ]


# ---------- runs-delete.json ----------

def delete_cases():
    return [
        case("a delete answered 404 succeeds as already gone", [
            begin("delete_asset", expect=sent(1, effect="delete", **{"safe-to-repeat": True})),
            outcome(1, fail(status=404), succeed("already deleted", "deterministic")),
            report(replans=0, **{"succeeded-calls": 1}, effects=[]),
        ], config=TOOLS, comment="semantics 7"),
        case("a delete answered 410 succeeds as already gone", [
            begin("delete_asset"), outcome(1, fail(status=410), succeed("already deleted")),
        ], config=TOOLS),
        case("a delete that timed out and then finds nothing was done by the first attempt", [
            begin("delete_asset"),
            outcome(1, fail(transport="timeout"), retry(attempt=2, key=None)),
            outcome(1, fail(status=404), succeed("already deleted")),
            report(effects=[{"call-id": 1, "tool": "delete_asset", "status": "applied"}]),
        ], config=TOOLS),
        case("a delete answered 400 is shown to the model", [
            begin("delete_asset"), outcome(1, fail(status=400, body="bad id"), replan("bad id")),
        ], config=TOOLS),
        case("a delete answered 404 with x-should-retry true still succeeds as already gone", [
            begin("delete_asset"), outcome(1, fail(status=404, headers=[("x-should-retry", "true")]), succeed("already deleted")),
        ], config=TOOLS),
        case("a read answered 404 is not treated as a delete", [
            begin("lookup_order"), outcome(1, fail(status=404), replan()),
        ], config=TOOLS),
    ]


# ---------- runs-hints.json ----------

def run_hint_cases():
    return [
        case("a hint longer than max-hint-ms escalates with the reset time", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("retry-after", "86400")], body="monthly spend cap reached"),
                    escalate("server-wait-too-long", "throttled", **{"resets-in-ms": 86400000},
                             note={"$contains": "Room returns in 86400 s, at 2025-12-01T00:00:00Z"})),
        ], config=TOOLS, comment="semantics 8: a spend cap is not waited out and not dropped"),
        case("a hint at exactly max-hint-ms is waited out", [
            begin("lookup_order"),
            outcome(1, fail(status=503, headers=[("retry-after", "60")]), retry(60000, 2, **{"hint-ms": 60000})),
        ], config=TOOLS),
        case("max-hint-ms is configurable", [
            begin("lookup_order"),
            outcome(1, fail(status=503, headers=[("retry-after", "6")]), escalate("server-wait-too-long", **{"resets-in-ms": 6000})),
        ], config={"max-hint-ms": 5000}),
        case("Anthropic's 7-day reset escalates", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("anthropic-ratelimit-requests-reset", "2025-12-07T00:00:00Z")]),
                    escalate("server-wait-too-long", **{"resets-in-ms": 7 * 86400000})),
        ], config=TOOLS),
        case("a persistent 429 without a hint ends through the run retry budget", [
            begin("lookup_order"),
            outcome(1, fail(status=429), retry(attempt=2)),
            outcome(1, fail(status=429), retry(attempt=3)),
            outcome(1, fail(status=429), escalate("run-retries-spent", "throttled")),
        ], config={"tools": REFUND_TOOLS, "max-retries-per-run": 2}, comment="semantics 8 and 9"),
        case("a garbage hint still retries with plain backoff", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("retry-after", "soon")]), retry(jitter(MID, 1), 2, **{"hint-ms": None, "reason": {"$contains": "ignored retry-after"}})),
        ], config=TOOLS),
    ]


# ---------- runs-budgets.json ----------

def budget_cases():
    return [
        case("max-attempts-per-call counts the first attempt", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), retry(attempt=3)),
            outcome(1, fail(status=503), retry(attempt=4)),
            outcome(1, fail(status=503), escalate("call-attempts-spent", last_error="HTTP 503")),
            report(attempts=4, retries=3, escalation="call-attempts-spent"),
        ], config=TOOLS, comment="semantics 9: default 4 attempts = 1 first + 3 retries"),
        case("the run retry budget is shared by all calls", [
            begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2)), outcome(1, SUCCESS),
            begin("lookup_order"), outcome(2, fail(status=503), retry(attempt=2)), outcome(2, SUCCESS),
            begin("lookup_order"), outcome(3, fail(status=503), escalate("run-retries-spent")),
        ], config={"tools": REFUND_TOOLS, "max-retries-per-run": 2}),
        case("run retry budget 0 escalates the first transient failure", [
            begin("lookup_order"), outcome(1, fail(transport="timeout"), escalate("run-retries-spent")),
        ], config={"tools": REFUND_TOOLS, "max-retries-per-run": 0}),
        case("the step budget refuses a call once spent", [
            begin("lookup_order"), outcome(1, SUCCESS),
            begin("lookup_order"), outcome(2, SUCCESS),
            begin("lookup_order", expect={"ok": {"escalate": {"reason": "run-steps-spent"}}}),
            report(calls=2, attempts=2, escalation="run-steps-spent"),
        ], config={"tools": REFUND_TOOLS, "max-steps-per-run": 2}),
        case("the step budget stops a retry", [
            begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), escalate("run-steps-spent")),
        ], config={"tools": REFUND_TOOLS, "max-steps-per-run": 2}),
        case("status checks count as steps", [
            begin("issue_refund"), outcome(1, fail(transport="timeout"), decision("check-status")),
            outcome(1, {"status-check": "absent"}, escalate("run-steps-spent")),
        ], config={"tools": REFUND_TOOLS, "max-steps-per-run": 2}),
        case("the narrowest spent budget names the escalation", [
            begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), escalate("call-attempts-spent")),
        ], config={"tools": REFUND_TOOLS, "max-attempts-per-call": 2, "max-retries-per-run": 1, "max-steps-per-run": 2}),
        case("a persistent 503 escalates naming the run budget and the effects made", [
            begin("issue_refund", key="k-1"), outcome(1, SUCCESS),
            begin("lookup_order"),
            outcome(2, fail(status=503), retry(attempt=2)),
            outcome(2, fail(status=503), retry(attempt=3)),
            outcome(2, fail(status=503), escalate("run-retries-spent",
                    note={"$contains": "retry budget is spent (max-retries-per-run)"},
                    effects=[{"tool": "issue_refund", "idempotency-key": "k-1", "status": "applied"}])),
        ], config={"tools": REFUND_TOOLS, "max-retries-per-run": 2}),
        case("a keyed write that timed out and escalated is listed as maybe applied", [
            begin("issue_refund", key="k-9"),
            outcome(1, fail(transport="timeout"), escalate("run-retries-spent",
                    effects=[{"call-id": 1, "idempotency-key": "k-9", "status": "unknown"}],
                    note={"$contains": "may have been applied; check before redoing it"})),
        ], config={"tools": REFUND_TOOLS, "max-retries-per-run": 0}),
    ]


# ---------- article-test-policy.json ----------

def article_cases():
    c = ("test_policy from "+'"Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up"'+", translated: delays are ranges with jitter, floored by the hint")
    return [
        case("article: a 503 is retried", [begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2))], config=TOOLS, comment=c),
        case("article: a timeout on a write without a key checks status", [
            begin("issue_refund"), outcome(1, fail(transport="timeout"), decision("check-status"))], config=TOOLS, comment=c),
        case("article: a timeout on a write with a key is retried", [
            begin("issue_refund", key="k"), outcome(1, fail(transport="timeout"), retry(attempt=2, key="k"))], config=TOOLS, comment=c),
        case("article: the second retry of a 429 waits within 0 to 2000 ms", [
            begin("lookup_order"), outcome(1, fail(status=429), retry(attempt=2)),
            outcome(1, fail(status=429), retry({"$range": [0, 2000]}, 3), entropy=0x1234_5678_9ABC_DEF0),
        ], config=TOOLS, comment=c + ": '2.0s' in the seed is the un-jittered ceiling 1000 × 2^1"),
        case("article: Retry-After 3 makes the wait at least 3000 ms", [
            begin("lookup_order"), outcome(1, fail(status=429, headers=[("retry-after", "3")]), retry({"$range": [3000, 3000]}, 2)),
        ], config=TOOLS, comment=c + ": the seed's '3.0s'; the floor lifts any draw up to 1000 ms to 3000"),
        case("article: a 403 escalates", [begin("lookup_order"), outcome(1, fail(status=403), escalate("permission-denied"))], config=TOOLS, comment=c),
        case("article: three 400s give replan, replan, escalate", [
            begin("issue_refund"), outcome(1, fail(status=400), replan()),
            begin("issue_refund"), outcome(2, fail(status=400), replan()),
            begin("issue_refund"), outcome(3, fail(status=400), escalate("replans-spent")),
        ], config=TOOLS, comment=c),
        case("article: a 503 with no retries left escalates", [
            begin("lookup_order"), outcome(1, fail(status=503), escalate("run-retries-spent"))],
            config={"tools": REFUND_TOOLS, "max-retries-per-run": 0}, comment=c),
        case("article: a 503 on the last attempt escalates", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)), outcome(1, fail(status=503), retry(attempt=3)),
            outcome(1, fail(status=503), retry(attempt=4)), outcome(1, fail(status=503), escalate("call-attempts-spent")),
        ], config=TOOLS, comment=c + ": max_retries=3 is max-attempts-per-call=4"),
    ]


# ---------- runs-errors.json ----------

def run_error_cases():
    return [
        case("an unknown call id is an error", [begin("lookup_order"), outcome(7, SUCCESS, {"err": {"unknown-call": 7}})]),
        case("call id 0 is an error", [begin("lookup_order"), outcome(0, SUCCESS, {"err": {"unknown-call": 0}})]),
        case("a status-check outcome with no check pending is an error", [
            begin("lookup_order"), outcome(1, {"status-check": "found"}, {"err": {"no-status-check-pending": 1}}),
            outcome(1, SUCCESS, succeed()),
        ], config=TOOLS),
        case("an attempt outcome while a status check is pending is an error", [
            begin("issue_refund"), outcome(1, fail(transport="timeout"), decision("check-status")),
            outcome(1, SUCCESS, {"err": {"status-check-pending": 1}}),
            outcome(1, {"status-check": "found"}, succeed("already applied")),
        ], config=TOOLS),
        case("an outcome after escalation is an error", [
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=403), escalate("permission-denied")),
            outcome(2, SUCCESS, {"err": {"run-ended": "permission-denied"}}),
        ], config=TOOLS),
    ]


# ---------- account-budget.json ----------

QUOTA_ACCOUNT = {"account-id": "acme", "capacity": 1000, "refill-interval-ms": 1,
                 "retry-quota": {"capacity": 20, "refill-interval-ms": 1000}}


def account_cases():
    acct = {"account-id": "acme", "capacity": 2, "refill-interval-ms": 1000, "max-wait-ms": 1500}
    cfg = {"tools": REFUND_TOOLS, "account-budget": acct}
    return [
        case("calls within the bucket go at once; the next waits for a token", [
            begin("lookup_order", expect=sent(1, **{"delay-ms": 0})),
            begin("lookup_order", expect=sent(2, **{"delay-ms": 0})),
            begin("lookup_order", expect=sent(3, **{"delay-ms": 1000})),
            report(waits=1, **{"waited-ms": 1000}),
        ], config=cfg, comment="GCRA: capacity 2, one token per 1000 ms"),
        case("a wait past max-wait-ms escalates with when room returns", [
            begin("lookup_order"), begin("lookup_order"), begin("lookup_order"),
            begin("lookup_order", expect={"ok": {"escalate": {"reason": "account-budget-exhausted", "resets-in-ms": 2000,
                                                             "note": {"$contains": "account budget exhausted"}}}}),
        ], config=cfg),
        case("retries take tokens from the account", [
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), retry(1000, 2), entropy=0),
        ], config=cfg, comment="the retry's own draw is 0 ms; the account has room in 1000 ms"),
        case("a retry the account cannot fit escalates", [
            begin("lookup_order"), begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), escalate("account-budget-exhausted", **{"resets-in-ms": 2000})),
        ], config=cfg),
        case("runs of one account share its bucket", [
            begin("lookup_order"), begin("lookup_order"),
            {"op": "start-run", "run-id": "run-2"},
            begin("lookup_order", expect=sent(1, **{"delay-ms": 1000})),
        ], config=cfg),
        case("the bucket refills with time", [
            begin("lookup_order"), begin("lookup_order"),
            begin("lookup_order", now=START + 2000, expect=sent(3, **{"delay-ms": 0})),
        ], config=cfg),
        case("retry-cost sets what a retry takes", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(1000, 2), entropy=0),
        ], config={"tools": REFUND_TOOLS, "account-budget": dict(acct, **{"retry-cost": 2, "max-wait-ms": 5000})},
            comment="capacity 2, the first call took 1: of the retry's 2 tokens one is there, the other 1000 ms away"),
        case("an empty retry quota fails a retry fast", [
            begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2)),
            begin("lookup_order"), outcome(2, fail(status=503), escalate("retry-quota-exhausted", **{"resets-in-ms": 8000})),
        ], config={"tools": REFUND_TOOLS, "account-budget": QUOTA_ACCOUNT},
            comment="quota 20, a retry costs 14: the second retry needs 8 tokens that return one per 1000 ms"),
        case("a success gives its retry's quota tokens back", [
            begin("lookup_order"), outcome(1, fail(status=503), retry(attempt=2)), outcome(1, SUCCESS),
            begin("lookup_order"), outcome(2, fail(status=503), retry(attempt=2)),
        ], config={"tools": REFUND_TOOLS, "account-budget": QUOTA_ACCOUNT},
            comment="AWS standard mode: the 14 tokens come back with the success, so the second retry fits"),
        case("a retry after a throttle takes less of the quota", [
            begin("lookup_order"),
            outcome(1, fail(status=429), retry(attempt=2)),
            outcome(1, fail(status=429), retry(attempt=3)),
            outcome(1, fail(status=429), escalate("retry-quota-exhausted")),
        ], config={"tools": REFUND_TOOLS, "account-budget": dict(QUOTA_ACCOUNT, **{"retry-quota": {"capacity": 10, "refill-interval-ms": 1000}})},
            comment="quota 10, a throttled retry costs 5: two fit, the third does not"),
        case("a retry after a throttle takes throttled-retry-cost", [
            begin("lookup_order"),
            outcome(1, fail(status=429), retry(0, 2), entropy=0),
        ], config={"tools": REFUND_TOOLS, "account-budget": dict(acct, **{"retry-cost": 2, "throttled-retry-cost": 1, "max-wait-ms": 5000})},
            comment="the same bucket as above: a throttled retry takes 1 token, which is there"),
    ]


# ---------- config.json ----------

def config_cases():
    defaults = {
        "base-delay-ms": 1000, "max-delay-ms": 30000, "max-attempts-per-call": 4, "max-retries-per-run": 10,
        "max-replans-per-run": 2, "max-steps-per-run": 30, "max-hint-ms": 60000, "max-plausible-hint-ms": 31536000000,
        "max-message-chars": 300, "default-effect": "write", "tools": {}, "status-overrides": {}, "tool-error-rules": [],
        "account-budget": None,
    }

    def load(config=None, text=None, expect=None):
        step = {"op": "load-policy"}
        if text is not None:
            step["config-text"] = text
        else:
            step["config"] = config
        step["expect"] = expect
        return step

    def err(kind, field, message=None):
        e = {"kind": kind, "field": field}
        if message:
            e["message"] = {"$contains": message}
        return {"err": e}

    return [
        case("an empty object gives every default", [load({}, expect={"ok": defaults})]),
        case("tools accept MCP annotations", [
            load({"tools": {"list_refunds": {"readOnlyHint": True}, "set_flag": {"idempotentHint": True}}},
                 expect={"ok": {"tools": {"list_refunds": {"effect": "read"}, "set_flag": {"effect": "write", "idempotent": True}}}})]),
        case("an account budget gets its defaults", [
            load({"account-budget": {"account-id": "acme", "capacity": 500, "refill-interval-ms": 7200}},
                 expect={"ok": {"account-budget": {"account-id": "acme", "capacity": 500, "refill-interval-ms": 7200,
                                                    "max-wait-ms": 5000, "attempt-cost": 1, "retry-cost": 1,
                                                    "throttled-retry-cost": 1, "retry-quota": None}}})]),
        case("an unknown field is rejected by name", [load({"retries": 3}, expect=err("unknown-field", "retries"))]),
        case("an unknown nested field is rejected by its path", [
            load({"tools": {"t": {"effect": "read", "speed": 1}}}, expect=err("unknown-field", "tools.t.speed"))]),
        case("a string where a number belongs is a wrong type", [
            load({"base-delay-ms": "1s"}, expect=err("wrong-type", "base-delay-ms", "whole number from 1 to 86400000"))]),
        case("a negative number is out of range", [load({"max-delay-ms": -5}, expect=err("out-of-range", "max-delay-ms"))]),
        case("a fraction is out of range", [load({"base-delay-ms": 1.5}, expect=err("out-of-range", "base-delay-ms"))]),
        case("zero attempts per call is out of range", [load({"max-attempts-per-call": 0}, expect=err("out-of-range", "max-attempts-per-call"))]),
        case("max-delay-ms below base-delay-ms is rejected", [
            load({"base-delay-ms": 5000, "max-delay-ms": 100}, expect=err("out-of-range", "max-delay-ms", "at least base-delay-ms"))]),
        case("an unknown effect is rejected", [load({"tools": {"t": {"effect": "launch"}}}, expect=err("out-of-range", "tools.t.effect", '"read"'))]),
        case("effect and MCP hints together are rejected", [
            load({"tools": {"t": {"effect": "read", "readOnlyHint": True}}}, expect=err("out-of-range", "tools.t", "not both"))]),
        case("a status override must be an error status", [
            load({"status-overrides": {"200": "transient"}}, expect=err("out-of-range", "status-overrides.200"))]),
        case("a status override cannot mean success", [
            load({"status-overrides": {"409": "success"}}, expect=err("out-of-range", "status-overrides.409"))]),
        case("an account budget needs an account id", [
            load({"account-budget": {"capacity": 5, "refill-interval-ms": 10}}, expect=err("out-of-range", "account-budget.account-id", "required"))]),
        case("a retry quota gets AWS standard mode's defaults", [
            load({"account-budget": {"account-id": "a", "capacity": 5, "refill-interval-ms": 10, "retry-quota": {"capacity": 500}}},
                 expect={"ok": {"account-budget": {"retry-quota": {"capacity": 500, "refill-interval-ms": 86400000, "retry-cost": 14,
                                                                    "throttled-retry-cost": 5, "success-refund": 1}}}})]),
        case("a retry quota needs a capacity", [
            load({"account-budget": {"account-id": "a", "capacity": 5, "refill-interval-ms": 10, "retry-quota": {}}},
                 expect=err("out-of-range", "account-budget.retry-quota.capacity", "required"))]),
        case("a retry cost above capacity is rejected", [
            load({"account-budget": {"account-id": "a", "capacity": 5, "refill-interval-ms": 10, "retry-cost": 6}},
                 expect=err("out-of-range", "account-budget.retry-cost"))]),
        case("text that is not JSON is a syntax error", [load(text="{", expect=err("syntax", "", "not valid JSON"))]),
        case("a JSON array is not a configuration", [load(text="[]", expect=err("wrong-type", ""))]),
        case("a duplicate field is a syntax error", [load(text='{"max-hint-ms": 1, "max-hint-ms": 2}', expect=err("syntax", "", "appears twice"))]),
        case("deep nesting is refused", [load(text="[" * 200, expect=err("syntax", "", "nesting deeper"))]),
        case("tool-error-rules are global and per tool, lower-cased", [
            load({"tools": {"search": {"tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}]}},
                  "tool-error-rules": [{"contains": "Quota Low", "class": "throttled"}]},
                 expect={"ok": {"tools": {"search": {"tool-error-rules": [{"contains": "e_busy", "class": "transient"}]}},
                                "tool-error-rules": [{"contains": "quota low", "class": "throttled"}]}})]),
        case("a tool-error rule needs a class a failure can have", [
            load({"tool-error-rules": [{"contains": "x", "class": "success"}]}, expect=err("out-of-range", "tool-error-rules[0].class"))]),
        case("a tool-error rule needs text to contain", [
            load({"tool-error-rules": [{"class": "transient"}]}, expect=err("out-of-range", "tool-error-rules[0].contains", "required"))]),
        case("max-plausible-hint-ms below max-hint-ms is rejected", [
            load({"max-plausible-hint-ms": 1000}, expect=err("out-of-range", "max-plausible-hint-ms", "at least max-hint-ms"))]),
        case("the old name max-attempts-per-run is an unknown field", [
            load({"max-attempts-per-run": 30}, expect=err("unknown-field", "max-attempts-per-run"))],
             comment="renamed max-steps-per-run in contract 0.2.0: it counts steps, status checks included"),
        case("the effective configuration echoes the fields given", [
            load({"base-delay-ms": 50, "status-overrides": {"409": "transient"}, "default-effect": "read"},
                 expect={"ok": {"base-delay-ms": 50, "status-overrides": {"409": "transient"}, "default-effect": "read"}})]),
    ]

# ---------- tool-errors.json ----------

GH = "github/github-mcp-server pkg/errors/error.go"
PYSDK = "modelcontextprotocol/python-sdk: FastMCP wraps a raised exception as 'Error executing tool {name}: {exc}'"


def tool_error_cases():
    """What a tool relays as isError text or structured content, with no status or
    headers reaching the host. Each row: description, text, structured content,
    expected class, hint in ms (or None), rule, source."""
    T, R, D, P, U = "throttled", "transient", "deterministic", "permission", "unclassified"
    voc, code, st, none = "tool-error:vocabulary", "tool-error:provider-code", "tool-error:status", "tool-error"
    rows = [
        # Statuses written in the text, with the words that make them one.
        ("a relayed 'HTTP 503' is transient", "Error executing tool lookup_order: upstream returned HTTP 503", None, R, None, st, PYSDK),
        ("a relayed '503 Service Unavailable' is transient", "GitLab API error: 503 Service Unavailable", None, R, None, st, "modelcontextprotocol/servers src/gitlab/index.ts"),
        ("a relayed 'status code 429' is throttled", "Failed to fetch https://example.com/ - status code 429", None, T, None, st, "modelcontextprotocol/servers src/fetch server.py"),
        ("a relayed '429 Too Many Requests' is throttled", "Brave API error: 429 Too Many Requests", None, T, None, voc, "modelcontextprotocol/servers src/brave-search/index.ts"),
        ("a relayed 'status 404' is deterministic", 'failed to get issue: unexpected status 404: {"message":"Not Found"}', None, D, None, st, GH + " NewGitHubAPIStatusErrorResponse"),
        ("a relayed '502 Bad Gateway' is transient", "upstream answered 502 Bad Gateway", None, R, None, st, "RFC 9110 15.6.3"),
        ("a relayed 'Error code: 500' is transient", "Error code: 500 - the server had an error", None, R, None, st, "openai-python _base_client.py: 'Error code: {status} - {body}'"),
        ("a relayed 'HTTP/1.1 504' is transient", "proxy said HTTP/1.1 504", None, R, None, st, "RFC 9112 status line"),
        ("an axios 'Request failed with status code 500' is transient", "Request failed with status code 500", None, R, None, st, "axios AxiosError message"),
        ("a relayed 'status: 401' is permission", "request rejected, status: 401", None, P, None, st, "RFC 9110 15.5.2"),
        # Provider error identifiers in JSON (structured content or JSON in the text).
        ("Anthropic overloaded_error in structured content is throttled", "Overloaded", {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}, T, None, code, "Anthropic API errors: overloaded_error (HTTP 529)"),
        ("Anthropic rate_limit_error is throttled", "rate limit", {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has exceeded your per-minute rate limit"}}, T, None, code, "Anthropic API errors: rate_limit_error"),
        ("Anthropic api_error is transient", "", {"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}, R, None, code, "Anthropic API errors: api_error (HTTP 500)"),
        ("Anthropic permission_error is permission", "", {"type": "error", "error": {"type": "permission_error", "message": "not allowed"}}, P, None, code, "Anthropic API errors: permission_error"),
        ("Anthropic authentication_error in JSON text is permission", '401 {"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}', None, P, None, code, "cline/cline#12 (Anthropic TS SDK message)"),
        ("Anthropic not_found_error is deterministic", "", {"type": "error", "error": {"type": "not_found_error", "message": "model: claude-x"}}, D, None, code, "Anthropic API errors: not_found_error"),
        ("a Python-repr Anthropic body is read by its identifier", "Error code: 529 - {'type': 'error', 'error': {'type': 'overloaded_error', 'message': 'Overloaded'}}", None, T, None, code, "anthropic-sdk-python _base_client.py (dict repr, not JSON)"),
        ("OpenAI rate_limit_exceeded with 'try again in 9.816s' waits 9816 ms", "Rate limit reached for gpt-4 on tokens per min (TPM): Limit 10000, Used 8554, Requested 3082. Please try again in 9.816s.",
         {"error": {"message": "Rate limit reached", "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}, T, 9816, code, "OpenAI error body (FoundationAgents/MetaGPT#523)"),
        ("OpenAI insufficient_quota is permission, not a throttle", "You exceeded your current quota, please check your plan and billing details.",
         {"error": {"type": "insufficient_quota", "code": "insufficient_quota"}}, P, None, voc, "OpenAI error body (ChatGPTNextWeb/NextChat#3123)"),
        ("OpenAI 'Request too large' with rate_limit_exceeded is deterministic", "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 31538.",
         {"error": {"type": "tokens", "code": "rate_limit_exceeded"}}, D, None, voc, "TheR1D/shell_gpt#653: no wait makes it fit"),
        ("OpenAI server_error is transient", "The server had an error while processing your request.", {"error": {"type": "server_error"}}, R, None, code, "openai-python APIStatusError bodies"),
        ("Google RESOURCE_EXHAUSTED with RetryInfo waits retryDelay", "quota", {"error": {"code": 429, "message": "You exceeded your current quota. Please retry in 53.016342224s.", "status": "RESOURCE_EXHAUSTED",
         "details": [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "53s"}]}}, T, 53000, code, "googleapis/python-genai#1875; google.rpc.RetryInfo"),
        ("Google UNAVAILABLE is transient", "", {"error": {"code": 503, "message": "The model is overloaded. Please try again later.", "status": "UNAVAILABLE"}}, R, None, code, "google-gemini/gemini-cli#5191"),
        ("Google PERMISSION_DENIED is permission", "", {"error": {"code": 403, "message": "User does not have sufficient permissions.", "status": "PERMISSION_DENIED"}}, P, None, code, "Google Analytics Data API errors"),
        ("Google 'API key not valid' is permission despite INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.",
         {"error": {"code": 400, "message": "API key not valid. Please pass a valid API key.", "status": "INVALID_ARGUMENT"}}, P, None, voc, "brunnurs/valuenet#12"),
        ("Google INVALID_ARGUMENT is deterministic", "", {"error": {"code": 400, "message": "bad field", "status": "INVALID_ARGUMENT"}}, D, None, code, "google.rpc.Code"),
        ("AWS __type ThrottlingException is throttled", "", {"__type": "com.amazon.coral.availability#ThrottlingException", "message": "Rate exceeded"}, T, None, code, "botocore retries/standard.py throttled codes"),
        ("AWS botocore ClientError text with ThrottlingException is throttled", "An error occurred (ThrottlingException) when calling the InvokeModel operation (reached max retries: 4): Too many requests", None, T, None, code, "botocore exceptions.py ClientError MSG_TEMPLATE"),
        ("AWS SlowDown is throttled", "<Error><Code>SlowDown</Code><Message>Reduce your request rate.</Message></Error>", None, T, None, code, "Amazon S3 error responses: SlowDown"),
        ("AWS RequestTimeout is transient", "", {"code": "RequestTimeout", "message": "Your socket connection to the server was not read from"}, R, None, code, "botocore retries/standard.py transient codes"),
        ("AWS PriorRequestNotComplete is transient", "", {"__type": "PriorRequestNotComplete"}, R, None, code, "botocore retries/standard.py transient codes"),
        ("AWS ProvisionedThroughputExceededException is throttled", "ProvisionedThroughputExceededException: The level of configured provisioned throughput for the table was exceeded.", None, T, None, code, "mifi/dynamodump#20"),
        ("AWS AccessDeniedException is permission", "An error occurred (AccessDeniedException) when calling the InvokeModel operation: You don't have access to the model", None, P, None, code, "aws-samples devsecops-chatbot#3"),
        ("AWS JS SDK v3 error with $metadata is read by name", "", {"name": "ThrottlingException", "$fault": "client", "$metadata": {"httpStatusCode": 429}}, T, None, code, "posit-dev/positron#7844"),
        ("Slack 'ratelimited' is throttled", '{"ok":false,"error":"ratelimited"}', None, T, None, code, "modelcontextprotocol/servers src/slack (body returned as text)"),
        # gRPC status names as grpc-go words them.
        ("grpc-go 'code = Unavailable' is transient", 'rpc error: code = Unavailable desc = connection error: desc = "transport: Error while dialing: dial tcp 0.0.0.0:9500: connect: connection refused"', None, R, None, code, "grpc-go status.Error format"),
        ("grpc-go 'code = DeadlineExceeded' is transient", "rpc error: code = DeadlineExceeded desc = context deadline exceeded", None, R, None, code, "grpc-go status.Error format"),
        ("grpc-go 'code = ResourceExhausted' is throttled", "rpc error: code = ResourceExhausted desc = quota exceeded", None, T, None, code, "gRPC status codes: RESOURCE_EXHAUSTED"),
        ("grpc 'received message larger than max' is deterministic", "rpc error: code = ResourceExhausted desc = grpc: received message larger than max (5039431 vs. 4194304)", None, D, None, voc, "grpc-go rpc_util.go"),
        ("grpc-go 'code = PermissionDenied' is permission", "rpc error: code = PermissionDenied desc = caller lacks scope", None, P, None, code, "gRPC status codes"),
        ("grpc 'failed to verify certificate' is unclassified", 'rpc error: code = Unavailable desc = connection error: desc = "transport: authentication handshake failed: tls: failed to verify certificate: x509: certificate is valid for a, not b"', None, U, None, voc, "a client configuration bug: retrying cannot fix it"),
        # Throttle and wait wording.
        ("GitHub 'rate limit exceeded. Retry after 47s' waits 47 s", "create issue: GitHub secondary rate limit exceeded. Retry after 47s.", None, T, 47000, voc, GH + " NewGitHubAPIErrorResponse"),
        ("GitHub 'Retry after 29m59s' is a throttle with a long wait", "search code: GitHub API rate limit exceeded. Retry after 29m59s.", None, T, 1799000, voc, GH),
        ("go-github 403 rate limit is a throttle, not a permission error", "failed to search code: GET https://api.github.com/search/code?q=x: 403 API rate limit exceeded for user ID 123. [rate reset in 14m02s]", None, T, 842000, voc, "google/go-github RateLimitError.Error formatRateReset"),
        ("'Permission Denied: API rate limit exceeded' is a throttle", "Permission Denied: API rate limit exceeded for user ID 1.", None, T, None, voc, "modelcontextprotocol/servers src/github maps GitHub's 403 rate limit to GitHubPermissionError"),
        ("'Please try again in 644ms' waits 644 ms", "429 Rate limit reached for gpt-4o on tokens per min (TPM). Please try again in 644ms.", None, T, 644, voc, "BuilderIO/micro-agent#86 (openai-node message)"),
        ("'Please try again in 9m38.016s' waits 578016 ms", "Rate limit reached for model llama-3.3-70b-versatile on tokens per day (TPD). Please try again in 9m38.016s.", None, T, 578016, voc, "continuedev/continue#10920 (Groq)"),
        ("'Retry after: 21 seconds.' waits 21 s", "You have exhausted your API Request Quota. Retry after: 21 seconds. Too many requests.", None, T, 21000, voc, "Akamai API 429 responses"),
        ("'Try again in 30 seconds' waits 30 s", "Error: Rate limit is exceeded. Try again in 30 seconds.", None, T, 30000, voc, "Azure-Samples/azure-search-openai-demo#177"),
        ("Slack 'retry-after: 30' waits 30 s", "A rate limit was exceeded (url: chat.postMessage, retry-after: 30)", None, T, 30000, voc, "@slack/web-api WebClient rate limit error"),
        ("'Resets at' an RFC 3339 time waits until then", "Rate Limit Exceeded: API rate limit exceeded for user ID 1. Resets at: 2025-11-30T00:02:00.000Z", None, T, 120000, voc, "modelcontextprotocol/servers src/github formatGitHubError"),
        ("'too many requests' wording is throttled", "the vendor says: too many requests, slow down", None, T, None, voc, "RFC 6585 4"),
        ("'quota exceeded' wording is throttled", "Daily quota exceeded for this project", None, T, None, voc, "Google APIs quota errors"),
        ("'Timed out ... Waited 30.0 seconds' is transient with no hint", "Timed out while waiting for response to CallToolRequest. Waited 30.0 seconds.", None, R, None, voc, "modelcontextprotocol/python-sdk shared/session.py: how long it waited, not a hint"),
        # Timeout and connection wording of client libraries.
        ("Go 'context deadline exceeded' is transient", 'Post "http://10.0.0.1:8000/v1/chat": context deadline exceeded (Client.Timeout exceeded while awaiting headers)', None, R, None, voc, "Go net/http"),
        ("Go 'i/o timeout' is transient", "dial tcp 10.20.33.66:80: i/o timeout", None, R, None, voc, "Go net"),
        ("Go 'connection reset by peer' is transient", "read tcp [::1]:65244->[::1]:8080: read: connection reset by peer", None, R, None, voc, "golang/go#20960"),
        ("Node 'ECONNREFUSED' is transient", "Error: connect ECONNREFUSED 127.0.0.1:443", None, R, None, voc, "Node.js net errors"),
        ("Node 'socket hang up' is transient", "Error: socket hang up", None, R, None, voc, "Node.js http"),
        ("undici 'fetch failed' is transient", "TypeError: fetch failed", None, R, None, voc, "nodejs/undici#2400"),
        ("undici UND_ERR_CONNECT_TIMEOUT is transient", "ConnectTimeoutError: Connect Timeout Error (attempted address: 104.16.123.96:443, timeout: 10000ms) code: 'UND_ERR_CONNECT_TIMEOUT'", None, R, None, voc, "undici errors"),
        ("Python requests 'Read timed out.' is transient", "HTTPSConnectionPool(host='api.example.com', port=443): Read timed out. (read timeout=100)", None, R, None, voc, "urllib3 ReadTimeoutError"),
        ("Python 'RemoteDisconnected' is transient", "('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))", None, R, None, voc, "psf/requests#5981"),
        ("urllib3 'too many 429 error responses' is throttled", "Max retries exceeded with url: /v1/playlists (Caused by ResponseError('too many 429 error responses'))", None, T, None, st, "spotDL/spotify-downloader#2139"),
        ("Java 'SocketTimeoutException: Read timed out' is transient", "java.net.SocketTimeoutException: Read timed out", None, R, None, voc, "Java SocketTimeoutException"),
        ("Java 'Connection refused' is transient", "java.net.ConnectException: Connection refused", None, R, None, voc, "Java ConnectException"),
        ("PostgreSQL 'too many clients already' is throttled", "FATAL: sorry, too many clients already", None, T, None, voc, "PostgreSQL SQLSTATE 53300"),
        # Permission wording.
        ("'Access denied - path outside allowed directories' is permission", "Access denied - path outside allowed directories: /etc/passwd not in /home/u", None, P, None, voc, "modelcontextprotocol/servers src/filesystem/lib.ts"),
        ("'Bad credentials' is permission", "Authentication Failed: Bad credentials", None, P, None, voc, "modelcontextprotocol/servers src/github formatGitHubError"),
        ("'Unauthorized' is permission", "Error: Unauthorized. Please check your MCP_SENTRY_AUTH_TOKEN token.", None, P, None, voc, "modelcontextprotocol/servers src/sentry server.py"),
        ("'password authentication failed' is permission", 'password authentication failed for user "x"', None, P, None, voc, "PostgreSQL message relayed by modelcontextprotocol/servers src/postgres"),
        ("a relayed '500 error' is transient", "the billing API gave a 500 error", None, R, None, st, "a status followed by the word error"),
        # Texts that must not match.
        ("'429 items' is not a throttle", "Cannot reserve 429 items: only 200 left in stock", None, D, None, none, "a bare number is not a status"),
        ("an order id with 503 in it is not an outage", "Order ORD-503 has no refundable amount left", None, D, None, none, "a number inside a word is not a status"),
        ("'refund of 500 rupees' is not a server error", "Refund of 500 rupees refused: the amount exceeds the order total of 450", None, D, None, none, "a number without a status word"),
        ("an argument error with snake_case names stays with the model", "amount_paise must be an integer, got '10.5'", None, D, None, none, "identifiers that are not provider codes"),
        ("'next update in 30 minutes' is not a wait hint", "Forecast unavailable for this city; next update in 30 minutes", None, D, None, none, "'in 30 minutes' without a retry word is not a hint"),
        ("an empty isError result stays with the model", "", None, D, None, none, "MCP: an isError result is the tool's verdict"),
    ]
    cases = []
    for description, text, structured, cls, hint, rule, source in rows:
        f = {"tool_error": True, "body": text}
        if structured is not None:
            f["structured"] = structured
        cases.append(case(description, [classify(f, {"class": cls, "hint-ms": hint, "rule": rule})], comment=source))
    # Configured rules, the host's status, headers, and text hints in a run.
    cases.append(case("a configured rule names a server's own code", [
        classify({"tool_error": True, "body": "E_BUSY: the index is rebuilding"}, {"class": "transient", "rule": "config:tool-error-rules"})],
        config={"tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}]}))
    cases.append(case("a configured rule comes before the built-in tables", [
        classify({"tool_error": True, "body": "rate limit on exports: E_PLAN_LIMIT"}, {"class": "permission", "rule": "config:tool-error-rules"})],
        config={"tool-error-rules": [{"contains": "e_plan_limit", "class": "permission"}]}))
    cases.append(case("the host's upstream status comes before the text", [
        classify({"tool_error": True, "upstream": 404, "body": "rate limit docs not found"}, {"class": "deterministic", "rule": "tool-error:host-status"})]))
    cases.append(case("a JSON-RPC internal error that relays a 403 is permission", [
        classify({"rpc": -32603, "body": "MCP error -32603: Permission Denied: Resource not accessible by integration"}, {"class": "permission"})],
        comment="the TypeScript SDK wraps a handler's throw as -32603 (modelcontextprotocol/typescript-sdk protocol.ts)"))
    cases.append(case("a JSON-RPC internal error with nothing to read stays transient", [
        classify({"rpc": -32603, "body": "Internal error"}, {"class": "transient", "rule": "json-rpc-code"})]))
    cases.append(case("text longer than 4096 bytes is read only up to there", [
        classify({"tool_error": True, "body": "x" * 5000 + " rate limit"}, {"class": "deterministic"})]))
    return cases


def tool_error_run_cases():
    k = key_of("run-1", "refund")
    return [
        case("a relayed 503 on a read is retried, not shown to the model", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="Error executing tool lookup_order: upstream returned HTTP 503"), retry(jitter(MID, 1), 2, cls="transient")),
            outcome(1, SUCCESS, succeed()),
            report(replans=0, retries=1),
        ], config=TOOLS),
        case("a relayed rate limit waits what the text asks", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="Rate limit reached. Please try again in 1s."), retry(1000, 2, cls="throttled", **{"hint-ms": 1000}), entropy=0),
        ], config=TOOLS, comment="the prose hint is a floor on the delay, as a Retry-After header is"),
        case("a relayed wait longer than max-hint-ms escalates with the reset", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="search code: GitHub API rate limit exceeded. Retry after 29m59s."),
                    escalate("server-wait-too-long", "throttled", **{"resets-in-ms": 1799000})),
        ], config=TOOLS),
        case("a relayed permission error escalates at once", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="403 Forbidden: Resource not accessible by integration"), escalate("permission-denied", "permission")),
        ], config=TOOLS),
        case("a relayed timeout on an unkeyed write asks for a status check", [
            begin("issue_refund"),
            outcome(1, fail(tool_error=True, body="dial tcp 10.0.0.7:443: i/o timeout"), decision("check-status", "transient")),
        ], config=TOOLS, comment="the write may have been applied upstream"),
        case("a relayed timeout on a keyed write is retried with the same key", [
            begin("issue_refund", key=k),
            outcome(1, fail(tool_error=True, body="context deadline exceeded"), retry(attempt=2, key=k, cls="transient")),
        ], config=TOOLS),
        case("text that matches nothing is shown to the model", [
            begin("issue_refund"),
            outcome(1, fail(tool_error=True, body="Cannot reserve 429 items: only 200 left in stock"), replan("429 items", "deterministic")),
        ], config=TOOLS),
        case("a per-tool rule applies to that tool only", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="E_BUSY"), retry(attempt=2, cls="transient")),
            outcome(1, SUCCESS),
            begin("list_refunds"),
            outcome(2, fail(tool_error=True, body="E_BUSY"), replan("E_BUSY", "deterministic")),
        ], config={"tools": dict(REFUND_TOOLS, lookup_order={"effect": "read", "tool-error-rules": [{"contains": "E_BUSY", "class": "transient"}]})}),
        case("the decision names the rule that applied", [
            begin("lookup_order"),
            outcome(1, fail(tool_error=True, body="", structured={"error": {"type": "overloaded_error"}}),
                    retry(attempt=2, cls="throttled", rule="tool-error:provider-code", reason={"$contains": "overloaded_error"})),
        ], config=TOOLS),
    ]


# ---------- limits.json (contract 0.3.0) ----------

def limits_cases():
    k = lambda n: f"k-{n}"
    writes = lambda n: [s for i in range(1, n + 1) for s in (begin("issue_refund", key=k(i)), outcome(i, SUCCESS))]
    record = lambda i: {"call-id": i, "tool": "issue_refund", "idempotency-key": k(i), "status": "applied"}
    long_id = "r" * 257
    return [
        case("a second report of one attempt is refused and changes nothing", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2), attempt=1),
            outcome(1, fail(status=503), {"err": {"attempt-mismatch": {"call-id": 1, "expected": 2, "reported": 1}}}, attempt=1),
            report(attempts=2, retries=1),
            outcome(1, SUCCESS, succeed(), attempt=2),
        ], config=TOOLS, comment="record-outcome names the attempt it reports: a host that records one 503 twice gets a typed error, not a second retry"),
        case("a report of an attempt not yet sent is refused", [
            begin("lookup_order"),
            outcome(1, fail(status=503), {"err": {"attempt-mismatch": {"call-id": 1, "expected": 1, "reported": 3}}}, attempt=3),
            report(attempts=1, retries=0),
        ], config=TOOLS),
        case("a status check reports the attempt whose effect it checked", [
            begin("issue_refund"),
            outcome(1, fail(transport="timeout"), decision("check-status"), attempt=1),
            outcome(1, {"status-check": "absent"}, retry(attempt=2), attempt=1),
            outcome(1, SUCCESS, succeed(), attempt=2),
        ], config=TOOLS),
        case("a report lists at most the first 10 and the last 10 effects and counts them all", writes(25) + [
            report(effects=[record(i) for i in list(range(1, 11)) + list(range(16, 26))], **{"effects-total": 25}),
        ], config=TOOLS),
        case("a run of 20 effects reports every one", writes(20) + [
            report(effects=[record(i) for i in range(1, 21)], **{"effects-total": 20}),
        ], config=TOOLS),
        case("an escalation lists at most 20 effects, counts them all, and names them in its note", writes(25) + [
            begin("issue_refund", key=k(26)),
            outcome(26, fail(status=403), escalate("permission-denied", effects=[record(i) for i in list(range(1, 11)) + list(range(16, 26))],
                                                   **{"effects-total": 25, "note": {"$contains": "... 5 more"}})),
        ], config=TOOLS),
        case("effects pages through every effect in order", writes(25) + [
            {"op": "effects", "start": 0, "max-count": 1000, "expect": [record(i) for i in range(1, 26)]},
            {"op": "effects", "start": 10, "max-count": 3, "expect": [record(i) for i in (11, 12, 13)]},
            {"op": "effects", "start": 24, "max-count": 10, "expect": [record(25)]},
            {"op": "effects", "start": 25, "max-count": 10, "expect": []},
            {"op": "effects", "start": 4000000000, "max-count": 10, "expect": []},
        ], config=TOOLS),
        case("a run id longer than 256 bytes is refused", [
            {"op": "start-run", "run-id": long_id,
             "expect": {"err": {"too-large": {"input": "run-id", "size-bytes": 257, "limit-bytes": 256}}}},
            {"op": "start-run", "run-id": "r" * 256, "expect": {"ok": None}},
        ]),
        case("a tool name or key longer than 256 bytes is refused and the run goes on", [
            begin("t" * 257, expect={"err": {"too-large": {"input": "tool", "size-bytes": 257, "limit-bytes": 256}}}),
            begin("issue_refund", key="k" * 300, expect={"err": {"too-large": {"input": "idempotency-key", "size-bytes": 300, "limit-bytes": 256}}}),
            begin("issue_refund", key="k" * 256, expect=sent(1)),
            report(calls=1, attempts=1),
        ], config=TOOLS),
        classify_case_headers(),
        case("a header value longer than 1024 bytes is not parsed", [
            classify({"status": 503, "headers": [("Retry-After", "1" * 1025), ("retry-after-ms", "250")]},
                     {"class": "transient", "hint-ms": 250, "header-problems": [
                         {"name": "retry-after", "problem": "is 1025 bytes, longer than the 1024 the policy reads"}]}),
        ]),
    ]


def classify_case_headers():
    headers = [(f"x-filler-{i}", "1") for i in range(64)] + [("Retry-After", "7")]
    return case("only the first 64 headers are read, and the rest are named", [
        classify({"status": 503, "headers": headers},
                 {"class": "transient", "hint-ms": None, "header-problems": [
                     {"name": "(headers)", "value": "", "problem": "only the first 64 of 65 headers were read"}]}),
    ])


# ---------- runs-transport.json (contract 0.5.0) ----------

WRITE_HINTS = {"read-only": False, "idempotent": False}
NO_SESSION_BODY = '{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: No valid session ID provided"},"id":null}'
REFUSED_REVISION = ('{"jsonrpc":"2.0","id":1,"error":{"code":-32022,"message":"Unsupported protocol version",'
                    '"data":{"supported":["2026-07-28"],"requested":"2025-11-25"}}}')


def transport_cases():
    return [
        case("a 404 to a request that carried a session id is a lost session: reconnect and resend, even a write", [
            begin("issue_refund"),
            outcome(1, fail(status=404, session=True, delivery="answer-started"),
                    retry(attempt=2, reconnect=True, cls="transient", rule="lost-session")),
        ], config=TOOLS, comment="the server did not run it (it did not know the session): no status check is needed"),
        case("a 404 without a session id is the tool's or the URL's and goes to the model", [
            begin("lookup_order"), outcome(1, fail(status=404), replan(cls="deterministic", rule="http-status")),
        ], config=TOOLS),
        case("a 400 that says the session expired is a lost session", [
            begin("lookup_order"),
            outcome(1, fail(status=400, body="Session expired", session=True), retry(reconnect=True, rule="lost-session")),
        ], config=TOOLS),
        case("a 400 whose JSON-RPC message says no valid session id is a lost session", [
            begin("lookup_order"),
            outcome(1, fail(status=400, body=NO_SESSION_BODY, session=True), retry(reconnect=True, rule="lost-session")),
        ], config=TOOLS),
        case("a 400 naming a tool called session_summary is not a lost session", [
            begin("lookup_order"),
            outcome(1, fail(status=400, body="Tool not found: session_summary", session=True), replan(cls="deterministic")),
        ], config=TOOLS),
        case("a 404 carrying JSON-RPC method not found was read by the server and goes to the model", [
            begin("lookup_order"),
            outcome(1, fail(status=404, body='{"error":{"code" : -32601}}', session=True),
                    replan(cls="deterministic", rule="json-rpc-code")),
        ], config=TOOLS),
        case("a refused revision is resent once on a new session, and a second refusal escalates with the answer", [
            begin("lookup_order"),
            outcome(1, fail(status=400, body=REFUSED_REVISION), retry(attempt=2, reconnect=True, rule="version-mismatch")),
            outcome(1, fail(rpc=-32022, body="Unsupported protocol version"),
                    escalate("protocol-version-unsupported", note={"$contains": "Unsupported protocol version"})),
        ], config=TOOLS),
        case("a TLS failure escalates at once as misconfigured", [
            begin("lookup_order"),
            outcome(1, fail(transport="tls", body="invalid peer certificate: UnknownIssuer", delivery="not-sent"),
                    escalate("connection-misconfigured", "misconfigured", note={"$contains": "UnknownIssuer"})),
        ], config=TOOLS),
        case("a name that does not resolve escalates at once as misconfigured", [
            begin("lookup_order"),
            outcome(1, fail(transport="name-resolution", delivery="not-sent"), escalate("connection-misconfigured", "misconfigured")),
        ], config=TOOLS),
        case("an unkeyed write whose request never left is resent without a status check", [
            begin("issue_refund"),
            outcome(1, fail(transport="stream-closed", delivery="not-sent"), retry(attempt=2, cls="transient", reconnect=False)),
        ], config=TOOLS),
        case("an unkeyed write whose request was written and then cut asks for a status check", [
            begin("issue_refund"),
            outcome(1, fail(transport="stream-closed", delivery="sent"), decision("check-status", "transient")),
        ], config=TOOLS),
        case("a server wait longer than the time left fails now, with both numbers in the note", [
            begin("lookup_order"),
            outcome(1, fail(status=429, headers=[("Retry-After", "30")]), time_left=20000,
                    expect=escalate("deadline-too-near", "throttled", note={"$contains": "the server asks to wait 30000 ms; 20000 ms remain"},
                                    resets_in_ms=30000)),
        ], config=TOOLS),
        case("a jittered delay is cut to the time left", [
            begin("lookup_order"),
            outcome(1, fail(status=503), entropy=2**64 - 1, time_left=120, expect=retry(delay=120, attempt=2)),
        ], config=TOOLS),
        case("a server wait equal to the time left fails now too", [
            begin("lookup_order"),
            outcome(1, fail(status=503, headers=[("Retry-After", "2")]), time_left=2000,
                    expect=escalate("deadline-too-near", note={"$contains": "the server asks to wait 2000 ms; 2000 ms remain"})),
        ], config=TOOLS),
        case("an account wait past the deadline fails now and books nothing", [
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), entropy=0, time_left=500,
                    expect=escalate("deadline-too-near", note={"$contains": "the account budget has room in 1000 ms; 500 ms remain"})),
            {"op": "start-run", "run-id": "run-2"},
            begin("lookup_order", expect=sent(1, **{"delay-ms": 1000})),
        ], config={"tools": REFUND_TOOLS, "account-budget": {"account-id": "acme", "capacity": 2, "refill-interval-ms": 1000,
                                                              "max-wait-ms": 1500}},
           comment="the refused retry took no token: the next call waits for the first refill, not the second"),
        case("a 400 whose JSON-RPC body is an SDK's -32000 goes to the model, not retried", [
            begin("issue_refund"),
            outcome(1, fail(status=400, body='{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}'),
                    replan(cls="deterministic", rule="json-rpc-code")),
        ], config=TOOLS),
        case("a 403 whose body carries -32022 is still a 403", [
            begin("lookup_order"),
            outcome(1, fail(status=403, body=REFUSED_REVISION), escalate("permission-denied", "permission")),
        ], config=TOOLS),
        case("no time left escalates instead of retrying", [
            begin("lookup_order"),
            outcome(1, fail(status=503), time_left=0,
                    expect=escalate("deadline-too-near", note={"$contains": "no time remains before the deadline"})),
        ], config=TOOLS),
        case("a status check that finds the write absent retries within the time left", [
            begin("issue_refund"),
            outcome(1, fail(transport="timeout", delivery="sent"), decision("check-status")),
            outcome(1, {"status-check": "absent"}, entropy=2**64 - 1, time_left=50, expect=retry(delay=50, attempt=2)),
        ], config=TOOLS),
        case("server/discover probe answers: wait, credentials and 5xx fail; other 4xx are an older server", [
            {"op": "read-probe-answer", "http-status": s, "expect": "failure"} for s in (401, 403, 408, 429, 500, 503)
        ] + [
            {"op": "read-probe-answer", "http-status": s, "expect": "older-server"} for s in (400, 404, 405, 406)
        ] + [
            {"op": "read-probe-answer", "json-rpc-code": -32601, "expect": "older-server"},
        ]),
    ]


# ---------- runs-abandon.json (contract 0.7.0) ----------

def abandon(call_id, why, sent=None, attempt=None, expect=None):
    step = {"op": "abandon-call", "call-id": call_id, "why": why}
    if sent is not None:
        step["sent"] = sent
    if attempt is not None:
        step["attempt"] = attempt
    step["expect"] = {"ok": None} if expect is None else expect
    return step


def abandon_cases():
    unknown_refund = {"call-id": 1, "tool": "issue_refund", "idempotency-key": None, "status": "unknown"}
    return [
        case("a read the caller cancelled is closed: a later report of it is refused, and the report counts it", [
            begin("lookup_order"),
            abandon(1, "cancelled"),
            outcome(1, SUCCESS, {"err": {"call-finished": 1}}),
            abandon(1, "cancelled", expect={"err": {"call-finished": 1}}),
            report(calls=1, attempts=1, abandoned_calls=1, succeeded_calls=0, effects=[], effects_total=0),
        ], config=TOOLS),
        case("a write stopped by its deadline while on the wire may have applied: an unknown effect", [
            begin("issue_refund"),
            abandon(1, "deadline"),
            report(abandoned_calls=1, effects=[unknown_refund], effects_total=1),
        ], config=TOOLS, comment="as a timed-out attempt's: the request left and no answer came"),
        case("a later escalation's note names the write that was stopped on the wire", [
            begin("issue_refund"),
            abandon(1, "deadline"),
            begin("lookup_order"),
            outcome(2, fail(status=403, body="no access"),
                    escalate("permission-denied", "permission", effects=[unknown_refund], note={"$contains": "issue_refund"})),
        ], config=TOOLS),
        case("a write stopped during the wait before its retry made no effect", [
            begin("issue_refund"),
            outcome(1, fail(transport="connection-refused", delivery="not-sent"), retry(attempt=2)),
            abandon(1, "cancelled", sent=False),
            report(attempts=2, retries=1, abandoned_calls=1, effects=[], effects_total=0),
        ], config=TOOLS, comment="the first attempt never left, and neither did the retry (attempts counts the retry decided)"),
        case("abandoning another attempt than the call's, or an unknown call, is refused and changes nothing", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            abandon(1, "cancelled", attempt=1, expect={"err": {"attempt-mismatch": {"call-id": 1, "expected": 2, "reported": 1}}}),
            abandon(7, "cancelled", expect={"err": {"unknown-call": 7}}),
            report(abandoned_calls=0),
            outcome(1, SUCCESS, succeed()),
        ], config=TOOLS),
        case("an escalated run lets the host close its calls in flight, for a snapshot", [
            begin("lookup_order"),
            begin("upload_asset"),
            begin("issue_refund"),
            outcome(3, fail(status=401), escalate("permission-denied")),
            abandon(1, "cancelled", expect={"ok": None}),
            abandon(2, "cancelled", expect={"ok": None}),
            abandon(2, "cancelled", expect={"err": {"call-finished": 2}}),
            report(abandoned_calls=2, escalation="permission-denied", effects=[{"call-id": 2, "tool": "upload_asset", "status": "unknown"}]),
            begin("lookup_order", expect={"err": {"run-ended": "permission-denied"}}),
        ], config=TOOLS, comment="contract 0.9.0: before, an escalated run refused abandon-call, and a write in flight was lost to the snapshot"),
        case("a call whose task the host stopped waiting for is closed: a later poll report is refused", [
            begin("lookup_order"),
            outcome(1, task(interval=1000), decision({"poll": {"delay-ms": 1000, "task-id": "t-1"}})),
            abandon(1, "deadline", sent=False),
            outcome(1, {"poll-failure": failure(status=503)}, {"err": {"call-finished": 1}}),
            report(tasks=1, polls=1, abandoned_calls=1),
        ], config=TOOLS),
    ]


# ---------- breakers.json (contract 0.8.0) ----------

SERVER = "https://mcp.example/mcp"
SERVER_KEY = "breaker:%d:%s" % (len(SERVER), SERVER)
NOW = 1764460800000


def on(tool, key=None, expect=None, now=None, server=SERVER):
    step = begin(tool, key=key, expect=expect, now=now)
    if server is not None:
        step["call"]["server"] = server
    return step


def refused(contains, rule="circuit-open"):
    return {"ok": {"replan": {"action": {"replan": {"$contains": contains}}, "rule": rule, "attempt": 0}}}


def changes(*items):
    return {"op": "breaker-changes", "expect": list(items)}


def change(old, new, until=None, why="", tool=None, server=SERVER):
    return {"server": server, "tool": tool, "old-state": old, "new-state": new, "until-ms": until, "why": {"$contains": why}}


def breakers(**fields):
    config = dict(TOOLS)
    config["circuit-breaker"] = dashed(fields)
    if "max-replans-per-run" not in config:
        config["max-replans-per-run"] = 5
    return config


def breaker_cases():
    down = "circuit breaker open"
    return [
        case("two 503s in a row open the server's and the tool's breakers: the retry becomes a replan", [
            on("lookup_order", expect=sent(1)),
            outcome(1, fail(status=503), retry(attempt=2)),
            changes(),
            outcome(1, fail(status=503), replan(down, "transient", rule="http-status")),
            changes(change("closed", "open", NOW + 1000, "2 failures in a row"),
                    change("closed", "open", NOW + 1000, "2 failures in a row", tool="lookup_order")),
            on("issue_refund", expect=refused("The server https://mcp.example has failed repeatedly")),
            changes(),
            report(calls=2, attempts=2, retries=1, replans=2),
        ], config=breakers(failures_to_open=2, cooldown_ms=1000),
           comment="the refused call is never sent: no attempt is counted, and the model may use another tool"),
        case("after the cooldown exactly one probe goes; its answer closes the breakers", [
            on("lookup_order"),
            outcome(1, fail(transport="connection-refused", delivery="not-sent"), replan(down)),
            on("lookup_order", now=NOW + 999, expect=refused("not called for 1 s")),
            on("lookup_order", now=NOW + 1000, expect=sent(3)),
            changes(change("open", "half-open", NOW + 1500, "one probe goes"),
                    change("open", "half-open", NOW + 1500, "one probe goes", tool="lookup_order")),
            on("list_refunds", now=NOW + 1001, expect=refused("has failed repeatedly")),
            outcome(3, SUCCESS, succeed(), now=NOW + 1100),
            changes(change("half-open", "closed", None, "the probe was answered"),
                    change("half-open", "closed", None, "the probe was answered", tool="lookup_order")),
            on("list_refunds", now=NOW + 1200, expect=sent(5)),
        ], config=breakers(failures_to_open=1, cooldown_ms=1000, probe_lease_ms=500)),
        case("a failed probe opens the breaker again with a longer cooldown, up to max-cooldown-ms", [
            on("lookup_order"),
            outcome(1, fail(status=502), replan(down)),
            on("lookup_order", now=NOW + 1000, expect=sent(2)),
            outcome(2, fail(status=503), replan(down), now=NOW + 1100),
            changes(change("half-open", "open", NOW + 4100, "the probe failed: the cooldown is now 3000 ms"),
                    change("half-open", "open", NOW + 4100, "the probe failed", tool="lookup_order")),
            on("lookup_order", now=NOW + 4099, expect=refused("not called for 1 s")),
            on("lookup_order", now=NOW + 4100, expect=sent(4)),
            outcome(4, fail(status=504), replan(down), now=NOW + 4200),
            changes(change("half-open", "open", NOW + 9200, "the cooldown is now 5000 ms"),
                    change("half-open", "open", NOW + 9200, "the cooldown is now 5000 ms", tool="lookup_order")),
        ], config=breakers(failures_to_open=1, cooldown_ms=1000, cooldown_multiplier=3, max_cooldown_ms=5000)),
        case("a tool's error, a 4xx and a throttle are answers: they never open a breaker", [
            on("lookup_order"),
            outcome(1, fail(status=429), retry(attempt=2)),
            outcome(1, fail(status=400, body="invalid argument 'order_id'"), replan("invalid argument")),
            on("lookup_order", expect=sent(2)),
            outcome(2, fail(tool_error=True, body="order not found"), replan("order not found")),
            on("lookup_order", expect=sent(3)),
            outcome(3, fail(status=404, body="Session not found", session=True), retry(attempt=2, reconnect=True)),
            outcome(3, fail(status=403, body="forbidden"), escalate("permission-denied")),
            changes(),
        ], config=breakers(failures_to_open=1)),
        case("half the calls in the window failing opens a breaker before failures in a row would", [
            on("lookup_order"),
            outcome(1, SUCCESS, succeed()),
            on("lookup_order"),
            outcome(2, fail(status=503), retry(attempt=2)),
            outcome(2, SUCCESS, succeed()),
            on("lookup_order"),
            outcome(3, fail(status=500), retry(attempt=2)),
            outcome(3, fail(status=500), replan(down)),
            changes(change("closed", "open", NOW + 30000, "at least 50% of the calls in the last 60000 ms failed")),
        ], config=breakers(failures_to_open=100, min_calls_in_window=5, per_tool=False),
           comment="five calls to the server, three failed: the ratio is reached at the fifth"),
        case("the tool's own breaker opens alone: another tool on the same server still goes", [
            on("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            on("list_refunds"),
            outcome(2, SUCCESS, succeed()),
            outcome(1, fail(status=503), replan("The tool lookup_order on https://mcp.example has failed repeatedly")),
            changes(change("closed", "open", NOW + 30000, "2 failures in a row", tool="lookup_order")),
            on("list_refunds", expect=sent(3)),
            on("lookup_order", expect=refused("The tool lookup_order")),
        ], config=breakers(failures_to_open=2)),
        case("a stored state the policy cannot trust is dropped, and replaced at the next change", [
            {"op": "put-shared-state", "key": SERVER_KEY, "value": "b1 o 0 0 0 0 0 0 %d 30000" % (NOW + 3600000)},
            on("lookup_order", expect=sent(1)),
            outcome(1, SUCCESS, succeed()),
            {"op": "shared-state", "key": SERVER_KEY, "expect": "b1 c 0 %d 1 0 0 0 0 0" % NOW},
            {"op": "put-shared-state", "key": SERVER_KEY, "value": "{\"state\": \"open\"}"},
            on("lookup_order", expect=sent(2)),
        ], config=breakers(failures_to_open=1),
           comment="open for an hour where max-cooldown-ms is five minutes: a skewed or hostile writer cannot lock a server out"),
        case("a call that names no server passes no breaker", [
            on("lookup_order", server=None),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), retry(attempt=3)),
            on("lookup_order", server=None, expect=sent(2)),
            changes(),
        ], config=breakers(failures_to_open=1)),
        case("with when-open escalate, a refused call escalates circuit-open with the time to the probe", [
            on("lookup_order"),
            outcome(1, fail(transport="timeout", delivery="sent"), escalate("circuit-open", resets_in_ms=1000)),
            {"op": "start-run", "run-id": "run-2", "expect": {"ok": None}},
            on("lookup_order", now=NOW + 400, expect={"ok": {"escalate": {"reason": "circuit-open", "resets-in-ms": 600}}}),
        ], config=breakers(failures_to_open=1, cooldown_ms=1000, when_open="escalate"),
           comment="the breaker is shared by every run of the case, as by every run of a host"),
        case("servers named alike share a breaker: case, user information, default port, query", [
            on("lookup_order", server="HTTPS://agent:secret@MCP.Example:443/mcp?token=abc#top"),
            outcome(1, fail(status=503), replan(down)),
            changes(change("closed", "open", NOW + 30000, "1 failure in a row"),
                    change("closed", "open", NOW + 30000, "1 failure in a row", tool="lookup_order")),
            on("list_refunds", server="https://mcp.example/mcp", expect=refused("The server https://mcp.example has")),
            on("list_refunds", server="https://mcp.example:8443/mcp", expect=sent(3)),
            on("list_refunds", server="stdio:node server.js", expect=sent(4)),
        ], config=breakers(failures_to_open=1),
           comment="the token in the query and the password reach neither the store nor the model"),
        case("a server named past 4096 bytes is refused; the policy keeps at most 256 bytes of a name", [
            on("lookup_order", server="stdio:" + "x" * 4091, expect={"err": {"too-large": {"input": "server", "size-bytes": 4097, "limit-bytes": 4096}}}),
            on("lookup_order", server="stdio:" + "y" * 4090, expect=sent(1)),
            outcome(1, fail(status=503), replan(down)),
            {"op": "shared-state", "key": "breaker:256:stdio:" + "y" * 250, "expect": {"$contains": "b1 o "}},
        ], config=breakers(failures_to_open=1)),
        case("a probe abandoned after it was sent keeps its place until its lease ends", [
            on("lookup_order"),
            outcome(1, fail(status=503), replan(down)),
            on("lookup_order", now=NOW + 1000, expect=sent(2)),
            abandon(2, "cancelled", sent=True),
            on("lookup_order", now=NOW + 1001, expect=refused("has failed repeatedly")),
            on("lookup_order", now=NOW + 61000, expect=sent(4)),
        ], config=breakers(failures_to_open=1, cooldown_ms=1000),
           comment="its answer may still come; another probe goes once the lease (60 s) is over"),
        case("a probe the host abandons unsent gives its place back: the next call probes at once", [
            on("lookup_order"),
            outcome(1, fail(status=503), replan(down)),
            on("lookup_order", now=NOW + 1000, expect=sent(2)),
            abandon(2, "cancelled", sent=False),
            on("lookup_order", now=NOW + 1001, expect=sent(3)),
        ], config=breakers(failures_to_open=1, cooldown_ms=1000)),
    ]


# ---------- runs-tasks.json (contract 0.6.0) ----------

def task(task_id="t-1", status="working", interval=None, ttl=None, age=None, message=None):
    """A `record-task-status` report, as the readable `task` outcome."""
    report = {"task-id": task_id, "status": status}
    if interval is not None:
        report["poll-interval-ms"] = interval
    if ttl is not None:
        report["ttl-ms"] = ttl
    if age is not None:
        report["age-ms"] = age
    if message is not None:
        report["message"] = message
    return {"task": report}


def poll_failed(**kw):
    """A `record-poll-failure` report, as the readable `poll-failure` outcome."""
    return {"poll-failure": failure(**kw)}


def poll(delay, task_id="t-1"):
    """A poll the task's report decided: attempt 1 still, nothing to cancel."""
    plan = {"task-id": task_id, "delay-ms": delay, "reconnect": False}
    return {"ok": {"action": {"poll": plan}, "attempt": 1, "rule": "task-status", "cancel-task": False}}


def stop(reason, cancel, cls=None, **extra):
    """An escalation that stops waiting for a task; `cancel`: the host cancels it first."""
    d = escalate(reason, cls, **extra)
    d["ok"]["cancel-task"] = cancel
    return d


TASK_TOOLS = {"tools": dict(REFUND_TOOLS, archive_orders={"effect": "write"})}


def task_cases():
    growing = dict(TASK_TOOLS, **{"task-poll-base-delay-ms": 100, "task-poll-max-delay-ms": 350})
    return [
        case("a write answered by a task is polled at the server's interval, and its completion succeeds", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=500), poll(delay=500)),
            outcome(1, task(interval=500), poll(delay=500)),
            outcome(1, SUCCESS, succeed()),
            report(attempts=1, retries=0, tasks=1, polls=2, **{"effects-total": 1}),
        ], config=TASK_TOOLS, comment="polls are neither attempts nor retries; the refund is one effect"),
        case("without a server interval the poll wait doubles from the base up to the cap", [
            begin("issue_refund", key="k1"),
            outcome(1, task(), poll(delay=100)), outcome(1, task(), poll(delay=200)),
            outcome(1, task(), poll(delay=350)), outcome(1, task(), poll(delay=350)),
        ], config=growing),
        case("the policy's own poll backoff past max-hint-ms is no server hint: it polls, up to its own cap", [
            begin("issue_refund", key="k1"),
            outcome(1, task(), poll(delay=1000)), outcome(1, task(), poll(delay=2000)), outcome(1, task(), poll(delay=3000)),
        ], config=dict(TASK_TOOLS, **{"task-poll-base-delay-ms": 1000, "task-poll-max-delay-ms": 3000, "max-hint-ms": 1000,
                                      "max-plausible-hint-ms": 1000}),
           comment="fuzzing's F6: the second report escalated server-wait-too-long with a 2000 ms 'hint' no server sent"),
        case("the server's interval is a floor above the growing wait", [
            begin("issue_refund", key="k1"), outcome(1, task(interval=5000), poll(delay=5000)),
        ], config=growing),
        case("a server interval of 0 is polled no faster than task-poll-min-delay-ms", [
            begin("issue_refund", key="k1"), outcome(1, task(interval=0), poll(delay=100)), outcome(1, task(interval=0), poll(delay=100)),
        ], config=TASK_TOOLS, comment="a hostile test saw 600 polls in no time before the floor"),
        case("slow answers count toward max-task-wait-ms, not only the waits decided", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, task(interval=100), now=1764460800950,
                    expect=stop("task-polls-spent", True, note={"$contains": "polled 1 times over 950 ms"})),
        ], config=dict(TASK_TOOLS, **{"max-task-wait-ms": 1000})),
        case("a task's time to live still bounds the polls after a failed poll", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100, ttl=1000, age=0), poll(delay=100)),
            outcome(1, poll_failed(status=503), entropy=0, now=1764460800950,
                    expect=stop("task-expired", True, note={"$contains": "expires in 50 ms"})),
        ], config=TASK_TOOLS),
        case("a server interval longer than max-hint-ms stops waiting and cancels the task", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=120000), stop("server-wait-too-long", True, note={"$contains": "task t-1"})),
        ], config=TASK_TOOLS),
        case("the poll budget spent escalates, names the task and cancels it", [
            begin("archive_orders", key="k1"),
            outcome(1, task(task_id="t-9", interval=100), poll(delay=100, task_id="t-9")),
            outcome(1, task(task_id="t-9", interval=100), poll(delay=100, task_id="t-9")),
            outcome(1, task(task_id="t-9", interval=100), stop("task-polls-spent", True, note={"$contains": "task t-9 was polled 2 times"})),
        ], config=dict(TASK_TOOLS, **{"max-polls-per-task": 2})),
        case("the longest total poll wait spent escalates task-polls-spent", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=600), poll(delay=600)),
            outcome(1, task(interval=600), stop("task-polls-spent", True)),
        ], config=dict(TASK_TOOLS, **{"max-task-wait-ms": 1000})),
        case("a task whose time to live ends before its next poll escalates task-expired and is cancelled", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=500, ttl=10000, age=9800),
                    stop("task-expired", True, note={"$contains": "task t-1 expires in 200 ms, before its next poll in 500 ms"})),
        ], config=TASK_TOOLS),
        case("a poll due after the deadline fails now, cancels the task and gives both numbers", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=500), time_left=300,
                    expect=stop("deadline-too-near", True, note={"$contains": "the next poll is due in 500 ms; 300 ms remain"})),
        ], config=TASK_TOOLS),
        case("a poll cut by the network is polled again; the tool is not called again", [
            begin("issue_refund"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, poll_failed(transport="connection-reset", delivery="sent"), entropy=0,
                    expect={"ok": {"action": {"poll": {"task-id": "t-1", "delay-ms": 100, "reconnect": False}}, "attempt": 1, "class": "transient"}}),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, SUCCESS, succeed()),
            report(attempts=1, retries=0, **{"status-checks": 0}, polls=3),
        ], config=TASK_TOOLS, comment="an unkeyed write: a durable task handle replaces the status check"),
        case("a poll whose session was lost is polled again on a new session", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, poll_failed(status=404, session=True), entropy=0,
                    expect={"ok": {"action": {"poll": {"reconnect": True}}, "rule": "lost-session"}}),
        ], config=TASK_TOOLS),
        case("a server that no longer knows the task escalates task-expired without a cancel", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, poll_failed(rpc=-32602, body="Unknown task: t-1"),
                    stop("task-expired", False, note={"$contains": "the server no longer knows task t-1"})),
        ], config=TASK_TOOLS),
        case("polls that fail max-attempts-per-call times in a row escalate and cancel the task", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, poll_failed(status=503), entropy=0, expect={"ok": {"action": {"poll": {}}}}),
            outcome(1, poll_failed(status=503), stop("task-polls-spent", True, note={"$contains": "2 polls of task t-1 failed in a row"})),
        ], config=dict(TASK_TOOLS, **{"max-attempts-per-call": 2})),
        case("a failed task of a keyed write is called again with the same key", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, fail(rpc=-32603, body="upstream ledger unavailable", delivery="answer-started"), entropy=0,
                    expect=retry(attempt=2, key="k1", cls="transient")),
        ], config=TASK_TOOLS),
        case("a failed task of an unkeyed write asks for a status check", [
            begin("issue_refund"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, fail(rpc=-32603, body="upstream ledger unavailable", delivery="answer-started"), decision("check-status", "transient")),
        ], config=TASK_TOOLS),
        case("a task the server cancelled goes to the model by default", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, task(status="cancelled", message="operator stopped it"),
                    {"ok": {"action": {"replan": {"$contains": "task t-1 cancelled: operator stopped it"}}, "cancel-task": False}}),
        ], config=TASK_TOOLS),
        case("with on-task-cancelled escalate, a cancelled task escalates task-cancelled", [
            begin("issue_refund", key="k1"),
            outcome(1, task(status="cancelled"), stop("task-cancelled", False)),
        ], config=dict(TASK_TOOLS, **{"on-task-cancelled": "escalate"})),
        case("a task asking for input nobody answered escalates with the question and is cancelled", [
            begin("issue_refund", key="k1"),
            outcome(1, task(status="input-required", message="Approve a refund of 250000 cents?"),
                    stop("input-required", True, "needs-input", note={"$contains": "task t-1 asks: Approve a refund of 250000 cents?"})),
        ], config=TASK_TOOLS),
        case("a task whose question a handler answered is polled on", [
            begin("issue_refund", key="k1"),
            outcome(1, task(status="input-answered", interval=100), poll(delay=100)),
            outcome(1, SUCCESS, succeed()),
        ], config=TASK_TOOLS),
        case("a request answered input_required with no handler escalates input-required with the question", [
            begin("lookup_order"),
            outcome(1, {"failure": {"kind": "input-required", "body": "Confirm order A1?"}},
                    escalate("input-required", "needs-input", note={"$contains": "Confirm order A1?"})),
        ], config=TASK_TOOLS),
        case("polls are not steps: a task polled past the step budget still completes", [
            begin("issue_refund", key="k1"),
            outcome(1, task(interval=100), poll(delay=100)), outcome(1, task(interval=100), poll(delay=100)),
            outcome(1, task(interval=100), poll(delay=100)), outcome(1, SUCCESS, succeed()),
        ], config=dict(TASK_TOOLS, **{"max-steps-per-run": 1})),
        case("a poll failure for a call without a task is an error", [
            begin("lookup_order"), outcome(1, poll_failed(status=503), {"err": {"no-task": 1}}), outcome(1, SUCCESS, succeed()),
        ], config=TASK_TOOLS),
        case("a task report while a status check is pending is an error", [
            begin("issue_refund"), outcome(1, fail(transport="timeout"), decision("check-status")),
            outcome(1, task(), {"err": {"status-check-pending": 1}}),
        ], config=TASK_TOOLS),
        case("a task id over 256 bytes is refused", [
            begin("issue_refund", key="k1"),
            outcome(1, task(task_id="t" * 257), {"err": {"too-large": {"input": "task-id", "size-bytes": 257, "limit-bytes": 256}}}),
        ], config=TASK_TOOLS),
        case("an expired page-snapshot ref goes to the model with advice to get a new handle, never retried", [
            begin("browser_click"),
            outcome(1, fail(tool_error=True, body="Ref e3 not found in the current page snapshot. Try capturing new snapshot."),
                    replan("get a new one", "deterministic", rule="tool-error:expired-handle")),
        ], config=TASK_TOOLS, comment="microsoft/playwright-mcp's wording"),
        case("a sandbox gone after its timeout is an expired handle, not a transient timeout", [
            begin("run_code", hints=READ),
            outcome(1, fail(tool_error=True, body="502: This error is likely due to sandbox timeout. You can modify the sandbox timeout."),
                    replan("no longer valid", "deterministic", rule="tool-error:expired-handle")),
        ], config=TASK_TOOLS, comment="e2b-dev/E2B SDKs' wording: re-running on the same sandbox fails the same way"),
        case("an expired cursor is an expired handle", [
            begin("search_docs", hints=READ),
            outcome(1, fail(tool_error=True, body="The provided cursor has expired. Start a new search to get a fresh cursor."),
                    replan(cls="deterministic", rule="tool-error:expired-handle")),
        ], config=TASK_TOOLS, comment="the Glean API's wording"),
        case("an attempt's timeouts come from the tool's entry, else the defaults", [
            begin("lookup_order", expect=sent(1, **{"idle-timeout-ms": 30000, "attempt-timeout-ms": 600000})),
            begin("export_report", expect=sent(2, **{"idle-timeout-ms": 5000, "attempt-timeout-ms": 20000})),
        ], config={"tools": dict(REFUND_TOOLS, export_report={"effect": "read", "idle-timeout-ms": 5000, "attempt-timeout-ms": 20000})}),
    ]


# ---------- observations.json: raw answers, replayed through each host's wrapper ----------

OBSERVATION_CONFIG = {"tools": {"lookup_order": {"effect": "read"}}}


def observed(description, answer, observation, expect, session):
    return {"description": description, "answer": answer, "session-id-sent": session, "observation": observation, "expect": expect}


def http_answer(status, body="", headers=()):
    answer = {"kind": "http", "status": status}
    if headers:
        answer["headers"] = [list(h) for h in headers]
    if body:
        answer["body"] = body
    return answer


def observation_cases():
    lost = {"action": "retry", "class": "transient", "rule": "lost-session", "reconnect": True}
    to_model = {"action": "replan", "class": "deterministic", "reconnect": False}
    rows = []
    # The seven rows of issue 23, each with a session id sent, then the same
    # status without one, then the other channels.
    for body, expect in [
        ("Session expired", lost),
        ("Session terminated", lost),
        (NO_SESSION_BODY, lost),
        ("Tool not found: session_summary", dict(to_model, rule="http-status")),
        ("invalid argument 'session_count'", dict(to_model, rule="http-status")),
    ]:
        rows.append(observed(f"HTTP 400 {body[:60]!r} with a session id", http_answer(400, body),
                             failure(status=400, body=body, session=True, delivery="answer-started"), expect, True))
    for body in ['{"error":{"code" : -32601}}', '{"error":{"code":-32601}}']:
        rows.append(observed(f"HTTP 404 {body} with a session id", http_answer(404, body),
                             failure(status=404, body=body, session=True, delivery="answer-started"),
                             dict(to_model, rule="json-rpc-code"), True))
    rows.append(observed("HTTP 404 with no body and a session id", http_answer(404),
                         failure(status=404, session=True, delivery="answer-started"), lost, True))
    rows.append(observed("HTTP 404 with no body and no session id", http_answer(404),
                         failure(status=404, delivery="answer-started"), dict(to_model, rule="http-status"), False))
    rows.append(observed("HTTP 400 Session expired without a session id", http_answer(400, "Session expired"),
                         failure(status=400, body="Session expired", delivery="answer-started"), dict(to_model, rule="http-status"), False))
    rows.append(observed("HTTP 503 with Retry-After", http_answer(503, "busy", [("Retry-After", "1")]),
                         failure(status=503, body="busy", headers=[("Retry-After", "1")], delivery="answer-started"),
                         {"action": "retry", "class": "transient", "rule": "http-status", "reconnect": False}, False))
    rows.append(observed("HTTP 403", http_answer(403, "refunds above 5000 need approval"),
                         failure(status=403, body="refunds above 5000 need approval", delivery="answer-started"),
                         {"action": "escalate", "class": "permission", "rule": "http-status", "reconnect": False}, False))
    rows.append(observed("HTTP 400 refusing the revision (-32022)", http_answer(400, REFUSED_REVISION),
                         failure(status=400, body=REFUSED_REVISION, delivery="answer-started"),
                         {"action": "retry", "class": "transient", "rule": "version-mismatch", "reconnect": True}, False))
    rows.append(observed("HTTP 400 'Invalid session name' with a session id is the tool's",
                         http_answer(400, "Invalid session name: must be alphanumeric"),
                         failure(status=400, body="Invalid session name: must be alphanumeric", session=True, delivery="answer-started"),
                         dict(to_model, rule="http-status"), True))
    unknown_param = '{"jsonrpc":"2.0","id":3,"error":{"code":-32602,"message":"Unknown session"}}'
    rows.append(observed("HTTP 400 JSON-RPC invalid params 'Unknown session' with a session id is the tool's",
                         http_answer(400, unknown_param),
                         failure(status=400, body=unknown_param, session=True, delivery="answer-started"),
                         dict(to_model, rule="json-rpc-code"), True))
    ts_not_found = '{"jsonrpc":"2.0","error":{"code":-32001,"message":"Session not found"},"id":null}'
    rows.append(observed("HTTP 404 JSON-RPC -32001 'Session not found' with a session id (TypeScript servers)",
                         http_answer(404, ts_not_found),
                         failure(status=404, body=ts_not_found, session=True, delivery="answer-started"), lost, True))
    not_initialized = '{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}'
    rows.append(observed("HTTP 400 JSON-RPC -32000 'Server not initialized' without a session id",
                         http_answer(400, not_initialized),
                         failure(status=400, body=not_initialized, delivery="answer-started"),
                         dict(to_model, rule="json-rpc-code"), False))
    rows.append(observed("HTTP 403 whose body carries -32022 is a 403", http_answer(403, REFUSED_REVISION),
                         failure(status=403, body=REFUSED_REVISION, delivery="answer-started"),
                         {"action": "escalate", "class": "permission", "rule": "http-status", "reconnect": False}, False))
    rows.append(observed("a server's JSON-RPC -32000 'Session not found' with a session id",
                         {"kind": "json-rpc-error", "code": -32000, "message": "Session not found"},
                         failure(rpc=-32000, body="Session not found", session=True, delivery="answer-started"), lost, True))
    rows.append(observed("JSON-RPC invalid params", {"kind": "json-rpc-error", "code": -32602, "message": "Invalid params: order_id"},
                         failure(rpc=-32602, body="Invalid params: order_id", delivery="answer-started"),
                         dict(to_model, rule="json-rpc-code"), False))
    rows.append(observed("JSON-RPC internal error", {"kind": "json-rpc-error", "code": -32603, "message": "Internal error"},
                         failure(rpc=-32603, body="Internal error", delivery="answer-started"),
                         {"action": "retry", "class": "transient", "rule": "json-rpc-code", "reconnect": False}, False))
    rows.append(observed("a tool error the model can fix", {"kind": "tool-text", "text": "order_id must look like ORD-123"},
                         failure(tool_error=True, body="order_id must look like ORD-123", delivery="answer-started"),
                         {"action": "replan", "class": "deterministic", "reconnect": False}, False))
    return rows


# ---------- resume.json (contract 0.9.0) ----------

def snap(expect=None, arguments=None, now=None):
    step = {"op": "snapshot"}
    if arguments is not None:
        step["arguments-json"] = arguments
    if now is not None:
        step["now-ms"] = now
    if expect is not None:
        step["expect"] = expect
    return step


def resume(answer, expect, edit=None, text=None, now=None):
    step = {"op": "resume", "answer": answer}
    if edit is not None:
        step["edit"] = edit
    if text is not None:
        step["snapshot-text"] = text
    if now is not None:
        step["now-ms"] = now
    step["expect"] = expect
    return step


def resumed(action, **fields):
    return {"ok": dict({"action": action}, **dashed(fields))}


def snapshot_error(kind, contains=""):
    return {"err": {"kind": kind, "message": {"$contains": contains}}}


def unknown_write():
    """An unkeyed write that timed out and whose status check could not tell."""
    return [
        begin("issue_refund"),
        outcome(1, fail(transport="timeout"), decision("check-status")),
        outcome(1, {"status-check": "unknown"}, escalate("status-unknown", note={"$contains": "retry (check first), done (check first), skip (check first) or abort (safe)"})),
    ]


def resume_cases():
    keyed = key_of("run-1", "step-1")
    args = '{"order_id":"A1","amount_paise":50000}'
    return [
        case("an unkeyed write whose status is unknown says check first; retry resends it as attempt 2", [
            *unknown_write(),
            snap({"ok": {"$contains": '"answers":{"retry":"check first","done":"check first","skip":"check first","abort":"safe"}'}}, arguments=args),
            resume("retry", resumed("send", **{"call-id": 1, "tool": "issue_refund", "attempt": 2, "idempotency-key": None, "arguments-json": args,
                                              "ticket": {"admitted": True, "call-id": 1, "delay-ms": 0, "safe-to-repeat": False}})),
            outcome(1, SUCCESS, succeed()),
            report(calls=1, attempts=2, retries=1, **{"status-checks": 1, "succeeded-calls": 1},
                   effects=[{"call-id": 1, "tool": "issue_refund", "status": "applied"}]),
        ], config=TOOLS, comment="the person's retry is the status check's answer: the write goes again, once"),
        case("a keyed write resumed with retry sends the same key, and its effect is listed once", [
            begin("issue_refund", key=keyed),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), escalate("call-attempts-spent", note={"$contains": "retry (safe)"})),
            snap(),
            resume("retry", resumed("send", **{"call-id": 1, "attempt": 3, "idempotency-key": keyed})),
            outcome(1, SUCCESS, succeed()),
            report(attempts=3, retries=2, effects=[{"call-id": 1, "idempotency-key": keyed, "status": "applied"}], **{"effects-total": 1}),
        ], config=dict(TOOLS, **{"max-attempts-per-call": 2})),
        case("a resumed run keeps its budgets: its next failure escalates at once", [
            begin("issue_refund", key=keyed),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), escalate("call-attempts-spent")),
            snap(),
            resume("retry", resumed("send", attempt=3)),
            outcome(1, fail(status=503), escalate("call-attempts-spent")),
            report(attempts=3, retries=2),
        ], config=dict(TOOLS, **{"max-attempts-per-call": 2}), comment="no answer gives a budget back: the retry the person allowed is counted"),
        case("done ends the call as succeeded with the person's result, and its write counts as applied", [
            *unknown_write(),
            snap(),
            resume({"done": "refund R-7 was issued"}, resumed("succeed", **{"result-text": "refund R-7 was issued", "attempt": 1, "ticket": None})),
            report(**{"succeeded-calls": 1}, effects=[{"call-id": 1, "status": "applied"}], escalation=None),
            begin("lookup_order", expect=sent(2)),
        ], config=TOOLS),
        case("skip tells the model the call was skipped; the run goes on", [
            *unknown_write(),
            snap(),
            resume("skip", resumed("replan", **{"call-id": 1})),
            {"op": "last-decision", "call-id": 1, "expect": {"action": {"replan": {"$contains": "A person chose to skip this call of issue_refund"}}, "rule": "resumed"}},
            begin("lookup_order", expect=sent(2)),
            report(replans=0, effects=[{"call-id": 1, "status": "unknown"}]),
        ], config=TOOLS, comment="the write may still have been applied: its effect stays unknown"),
        case("abort ends the run, escalated aborted, for good", [
            *unknown_write(),
            snap(),
            resume("abort", resumed("escalate")),
            {"op": "escalation", "expect": {"reason": "aborted", "note": {"$contains": "a person aborted the run"}}},
            begin("lookup_order", expect={"err": {"run-ended": "aborted"}}),
            snap(snapshot_error("not-escalated", "a person aborted the run")),
        ], config=TOOLS),
        case("an unkeyed write known applied says check first before retry and skip", [
            begin("issue_refund"),
            outcome(1, {"empty-result": "no refund id in the answer"}, escalate("replans-spent",
                    note={"$contains": "retry (check first), done (safe), skip (check first) or abort (safe)"})),
            snap({"ok": {"$contains": '"answers":{"retry":"check first","done":"safe","skip":"check first","abort":"safe"}'}}),
        ], config=dict(TOOLS, **{"max-replans-per-run": 0}), comment="the server answered: the refund was applied, so a resend without a key doubles it"),
        case("a snapshot whose advice was edited is refused as tampered", [
            *unknown_write(),
            snap(),
            resume("retry", snapshot_error("tampered"), edit=['"retry":"check first"', '"retry":"safe"']),
        ], config=TOOLS),
        case("a call begin refused is resumed by beginning it with its key", [
            begin("lookup_order"), outcome(1, SUCCESS, succeed()),
            begin("issue_refund", key=keyed, expect={"ok": {"escalate": {"reason": "run-steps-spent"}}}),
            snap({"ok": {"$contains": '"begun":false'}}),
            resume("retry", resumed("send", **{"call-id": 2, "tool": "issue_refund", "attempt": 1, "idempotency-key": keyed})),
            outcome(2, SUCCESS, succeed()),
            report(calls=2, attempts=2),
        ], config=dict(TOOLS, **{"max-steps-per-run": 1})),
        case("a snapshot of a run that has not escalated is refused", [
            begin("lookup_order"),
            snap(snapshot_error("not-escalated")),
        ], config=TOOLS),
        case("a snapshot while another call is open is refused until it is abandoned", [
            begin("lookup_order"),
            begin("issue_refund"),
            outcome(2, fail(status=403), escalate("permission-denied", note={"$contains": "retry (safe), done (check first), skip (safe)"})),
            snap(snapshot_error("calls-open", "call 1 is still open")),
            {"op": "abandon-call", "call-id": 1, "why": "cancelled", "sent": False, "expect": {"ok": None}},
            snap({"ok": {"$contains": '"stopped-call":2'}}),
        ], config=TOOLS),
        case("a changed snapshot is refused as tampered; a cut one as malformed", [
            *unknown_write(),
            snap(),
            resume("retry", snapshot_error("tampered", "changed after it was taken"), edit=['"retries":0', '"retries":5']),
            resume("retry", snapshot_error("tampered"), edit=['"status-checks":1', '"status-checks":0']),
            resume("retry", snapshot_error("malformed", "not valid JSON"), edit=['"digest"', '"digest']),
            resume("retry", snapshot_error("malformed", "a snapshot must be a JSON object"), text="[]"),
        ], config=TOOLS, comment="a verdict cannot reset a budget, and nor can an edit: the digest covers every counter"),
        case("a snapshot of another contract major is refused naming both versions", [
            *unknown_write(),
            snap(),
            resume("retry", snapshot_error("other-contract", "taken under contract 0.8.0; this policy speaks 0.9.0"),
                   edit=['"contract":"0.9.0"', '"contract":"0.8.0"']),
        ], config=TOOLS),
    ]


# ---------- retry-budgets.json (contract 0.9.0) ----------

RATIO_ACCOUNT = {"account-id": "acme", "capacity": 1000, "refill-interval-ms": 1,
                 "retry-ratio": {"percent": 50, "min-retries-per-second": 0, "window-ms": 10000}}


def retry_budget_cases():
    return [
        case("retries past the ratio of the account's calls fail fast", [
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(2, fail(status=503), escalate("retry-budget-exhausted", **{"resets-in-ms": 10000})),
        ], config={"tools": REFUND_TOOLS, "account-budget": RATIO_ACCOUNT},
            comment="50 % of 2 calls is 1 retry; the window ends in 10 s"),
        case("the ratio is the account's: runs share it through the shared state", [
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            {"op": "start-run", "run-id": "run-2"},
            begin("lookup_order"), begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(2, fail(status=503), escalate("retry-budget-exhausted")),
            {"op": "shared-state", "key": "retry-ratio:4:acme", "expect": "r1 1764460800000 4 2 0 0"},
        ], config={"tools": REFUND_TOOLS, "account-budget": RATIO_ACCOUNT},
            comment="4 calls allow 2 retries, the third is refused and not counted"),
        case("a floor per second lets a quiet account retry", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
            outcome(1, fail(status=503), retry(attempt=3)),
            outcome(1, fail(status=503), escalate("retry-budget-exhausted")),
        ], config={"tools": REFUND_TOOLS, "account-budget": dict(RATIO_ACCOUNT, **{"retry-ratio": {"percent": 0, "min-retries-per-second": 1, "window-ms": 2000}})},
            comment="0 % of the calls, but 1 a second for 2 s: 2 retries, and not a third"),
        case("a stored text the ratio did not write is dropped, not trusted", [
            {"op": "load-policy", "config": {"tools": REFUND_TOOLS, "account-budget": dict(RATIO_ACCOUNT, **{"retry-ratio": {"percent": 100, "min-retries-per-second": 0}})}},
            {"op": "put-shared-state", "key": "retry-ratio:4:acme", "value": "r1 1764460800000 0 99999 0 0 extra"},
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(attempt=2)),
        ], comment="a text with a field too many (99,999 retries) is not read: counting starts again, and 100 % of 1 call is 1 retry"),
        case("aws-2026: a transient retry's ceiling is 50 ms, a throttle's 1 s", [
            begin("lookup_order"),
            outcome(1, fail(status=503), retry(25, 2), entropy=MID),
            outcome(1, fail(status=429), retry(2000, 3), entropy=MAX),
            outcome(1, fail(status=503), escalate("call-attempts-spent")),
        ], config=dict(TOOLS, preset="aws-2026"),
            comment="AWS SDKs' retry behavior 2.1 (10 Nov 2026): t = rand * min(base * 2^(n-1), 20 s), base 50 ms or 1 s; 3 attempts"),
        case("aws-2026: a server's hint is honoured up to the backoff plus 5 s, not escalated", [
            begin("lookup_order"),
            outcome(1, fail(status=503, headers=[("retry-after", "3600")]), retry(5025, 2), entropy=MID),
        ], config=dict(TOOLS, preset="aws-2026"),
            comment="x-amz-retry-after and Retry-After: delay = max(t, min(hint, t + 5 s)); without the preset a 1-hour hint escalates server-wait-too-long"),
        case("aws-2026 with an account budget adds a retry quota of 500 costing 14 and 5", [
            {"op": "load-policy", "config": dict(TOOLS, preset="aws-2026", **{"account-budget": {"account-id": "acme", "capacity": 10, "refill-interval-ms": 100}}),
             "expect": {"ok": {"preset": "aws-2026", "base-delay-ms": 50, "throttle-base-delay-ms": 1000, "max-delay-ms": 20000, "max-attempts-per-call": 3,
                               "hint-cap-over-backoff-ms": 5000,
                               "account-budget": {"retry-quota": {"capacity": 500, "retry-cost": 14, "throttled-retry-cost": 5, "success-refund": 1}}}}},
        ]),
        case("the default preset keeps today's numbers", [
            {"op": "load-policy", "config": {}, "expect": {"ok": {"preset": "default", "base-delay-ms": 1000, "throttle-base-delay-ms": 0, "max-delay-ms": 30000,
                                                                "max-attempts-per-call": 4, "hint-cap-over-backoff-ms": 0}}},
        ]),
    ]


# ---------- gate.json: what every live update must keep ----------

GATE_KEY = "ar1-00000000000000000000000000000001"


def gate_cases():
    keyed = lambda: begin("self_test_write", key=GATE_KEY, hints=WRITE_HINTS)
    unkeyed = lambda: begin("self_test_write", hints=WRITE_HINTS)
    escalated = {"escalate": {}}
    return [
        case("a keyed write that fails 503 is retried with its key unchanged, or escalated", [
            keyed(), outcome(1, fail(status=503), entropy=2**64 - 1,
                             expect={"ok": {"action": {"$any": [{"retry": {"idempotency-key": GATE_KEY}}, escalated]}}}),
        ], comment="run under the candidate's own configuration"),
        case("a keyed write whose session was lost is resent with its key unchanged, or escalated", [
            keyed(), outcome(1, fail(status=404, session=True, delivery="answer-started"),
                             expect={"ok": {"action": {"$any": [{"retry": {"idempotency-key": GATE_KEY}}, escalated]}}}),
        ]),
        case("an unkeyed write that timed out is never resent without a status check", [
            unkeyed(), outcome(1, fail(transport="timeout", delivery="sent"),
                               expect={"ok": {"action": {"$any": ["check-status", escalated]}}}),
        ]),
        case("a 403 escalates and is never retried", [
            keyed(), outcome(1, fail(status=403, body="self-test"), expect={"ok": {"action": escalated}}),
        ]),
        case("a 401 escalates and is never retried", [
            keyed(), outcome(1, fail(status=401), expect={"ok": {"action": escalated}}),
        ]),
        case("a 403 whose body carries -32022 still escalates", [
            keyed(), outcome(1, fail(status=403, body=REFUSED_REVISION), expect={"ok": {"action": escalated}}),
        ]),
        case("a 400 whose JSON-RPC body is an SDK's -32000 is never repeated as it is", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=400, body='{"jsonrpc":"2.0","error":{"code":-32000,"message":"Bad Request: Server not initialized"},"id":null}'),
                    expect={"ok": {"action": {"$any": [{"replan": {"$contains": ""}}, escalated]}}}),
        ]),
        case("a 400 on a read is never repeated as it is", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=400, body="bad order_id"),
                    expect={"ok": {"action": {"$any": [{"replan": {"$contains": ""}}, escalated]}}}),
        ]),
        case("the idempotency key is the contract's derivation", [
            {"op": "derive-idempotency-key", "run-id": "self-test", "action-id": "step-1", "expect": key_of("self-test", "step-1")},
        ]),
        case("a retry waits within the configuration's own caps", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=503), entropy=2**64 - 1,
                    expect={"ok": {"action": {"$any": [{"retry": {"delay-ms": {"$range": [0, {"$config": "retry-wait-cap-ms"}]}}}, escalated]}}}),
        ], comment="run under the candidate's own configuration: the host reads the cap from that configuration's text, never from the candidate"),
        case("next-delay waits within the configuration's own max-delay-ms", [
            {"op": "next-delay", "retry": 30, "hint-ms": None, "entropy": hexu(2**64 - 1),
             "expect": {"$range": [0, {"$config": "max-delay-ms"}]}},
        ], comment="run under the candidate's own configuration"),
        case("a retry waits within max-delay-ms", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=503), entropy=2**64 - 1, expect={"ok": {"action": {"retry": {"delay-ms": {"$range": [0, 2000]}}}}}),
        ], config={"base-delay-ms": 1000, "max-delay-ms": 2000}),
        case("a retry waits within the time left", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=503), entropy=2**64 - 1, time_left=10,
                    expect={"ok": {"action": {"$any": [{"retry": {"delay-ms": {"$range": [0, 10]}}}, escalated]}}}),
        ]),
        case("every other export answers, well-formed", [
            {"op": "classify", "failure": failure(status=503, headers=[("Retry-After", "1")], body="self-test"),
             "expect": {"rule": {"$contains": ""}, "reason": {"$contains": ""}}},
            {"op": "read-probe-answer", "http-status": 429, "expect": "failure"},
            {"op": "read-probe-answer", "http-status": 404, "expect": "older-server"},
            {"op": "report", "expect": {"run-id": "run-1", "calls": 0}},
            {"op": "effects", "start": 0, "max-count": 10, "expect": []},
        ]),
        case("next-delay waits within max-delay-ms", [
            {"op": "next-delay", "retry": 1, "hint-ms": None, "entropy": hexu(2**64 - 1), "expect": {"$range": [0, 2000]}},
            {"op": "next-delay", "retry": 30, "hint-ms": None, "entropy": hexu(2**64 - 1), "expect": {"$range": [0, 2000]}},
        ], config={"base-delay-ms": 1000, "max-delay-ms": 2000}),
        case("a failure that persists escalates within max-attempts-per-call", [
            begin("self_test_read", hints=READ),
            outcome(1, fail(status=503), expect={"ok": {"action": {"$any": [{"retry": {}}, escalated]}}}),
            outcome(1, fail(status=503), expect={"ok": {"action": {"$any": [{"retry": {}}, escalated]}}}),
            outcome(1, fail(status=503), expect={"ok": {"action": escalated}}),
        ], config={"max-attempts-per-call": 3}),
    ]


# ---------- guard/guard.json: what every wrapper enforces, whatever the policy says ----------

GUARD_DIR = "guard"


def g_begin(tool="issue_refund", key=None, hints=None, delay=0):
    return {"begin": {"tool": tool, "idempotency-key": key, "hints": hints, "delay-ms": delay}}


def g_attempted(what, call=None):
    event = {"attempted": what}
    if call is not None:
        event["call"] = call
    return event


def g_verdict(action, attempt=1, delay=0, hint=None, reconnect=False, call=None, cancel_task=False):
    event = {"verdict": {"action": action, "attempt": attempt, "delay-ms": delay, "hint-ms": hint, "reconnect": reconnect,
                         "cancel-task": cancel_task}}
    if call is not None:
        event["call"] = call
    return event


def g_polled(what):
    return {"polled": what}


def g_task(status, interval=None):
    report = {"task-id": "t-1", "status": status}
    if interval is not None:
        report["poll-interval-ms"] = interval
    return {"task": report}


def g_decision(action, delay=0, reconnect=False, key=None):
    return {"decision": {"action": action, "delay-ms": delay, "reconnect": reconnect, "idempotency-key": key}}


def g_check(result):
    return {"status-check": result}


def g_case(description, events, violation=None, at=None, config=None, comment=None):
    c = {"description": description}
    if comment:
        c["comment"] = comment
    c["config"] = config or {}
    c["events"] = events
    c["expect"] = {"violation": violation, "event": at} if violation else {"violation": None}
    return c


READ_HINTS = {"read-only": True, "destructive": False, "idempotent": True}
IDEMPOTENT_HINTS = {"read-only": False, "destructive": False, "idempotent": True}
TIMED_OUT = fail(transport="timeout", delivery="sent")


def guard_cases():
    return [
        # client-error-repeated
        g_case("a 403 retried as it was", [g_begin(key="k-1"), g_attempted(fail(status=403)), g_verdict("retry", delay=100)],
               "client-error-repeated", 2),
        g_case("a 403 escalated is kept", [g_begin(key="k-1"), g_attempted(fail(status=403)), g_verdict("escalate")]),
        g_case("each of 400 401 404 409 422 retried as it was is refused",
               [e for status in (400, 401, 404, 409, 422) for e in
                (g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=status)), g_verdict("replan"))]
               + [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=422)), g_verdict("retry", delay=100)],
               "client-error-repeated", 17),
        g_case("a 409 the configuration makes transient may be retried",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=409)), g_verdict("retry", delay=100)],
               config={"status-overrides": {"409": "transient"}}),
        g_case("a 409 the configuration makes deterministic is still refused",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=409)), g_verdict("retry", delay=100)],
               "client-error-repeated", 2, config={"status-overrides": {"409": "deterministic"}}),
        g_case("a 429 may be retried", [g_begin(key="k-1"), g_attempted(fail(status=429)), g_verdict("retry", delay=100)]),
        g_case("invalid params (-32602) retried as it was",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(rpc=-32602)), g_verdict("retry", delay=100)],
               "client-error-repeated", 2),
        g_case("a 404 with a session id retried on a new session, twice",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=404, session=True)), g_verdict("retry", reconnect=True),
                g_attempted(fail(status=404, session=True)), g_verdict("retry", attempt=2, reconnect=True)]),
        g_case("a 400 without a session id retried on a new connection once",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=400, body='{"jsonrpc":"2.0","id":1,"error":{"code":-32022}}')),
                g_verdict("retry", reconnect=True)]),
        g_case("a 400 without a session id retried on a new connection twice",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(status=400)), g_verdict("retry", reconnect=True),
                g_attempted(fail(status=400)), g_verdict("retry", attempt=2, reconnect=True)],
               "client-error-repeated", 4),
        g_case("a 403 relayed by a tool is the policy's to read",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(fail(tool_error=True, upstream=403, body="HTTP 403")),
                g_verdict("retry", delay=100)],
               comment="The host sees a tool result, not an HTTP answer: which text means what is the component's."),
        # unknown-write-resent
        g_case("an unkeyed write that timed out resent without a status check",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)], "unknown-write-resent", 2),
        g_case("an unkeyed write that timed out, checked absent, then resent",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("check-status"), g_check("absent"), g_verdict("retry", delay=100)]),
        g_case("an unkeyed write checked found, then resent",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("check-status"), g_check("found"), g_verdict("retry", delay=100)],
               "unknown-write-resent", 4),
        g_case("an unkeyed write checked unknown, then resent",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("check-status"), g_check("unknown"), g_verdict("retry", delay=100)],
               "unknown-write-resent", 4),
        g_case("an unkeyed write cut mid-answer resent",
               [g_begin(), g_attempted(fail(transport="stream-closed", delivery="answer-started")), g_verdict("retry", delay=100)],
               "unknown-write-resent", 2),
        g_case("an unkeyed write never sent may be resent",
               [g_begin(), g_attempted(fail(transport="connection-reset", delivery="not-sent")), g_verdict("retry", delay=100)]),
        g_case("an unkeyed write to a refused connection may be resent",
               [g_begin(), g_attempted(fail(transport="connection-refused")), g_verdict("retry", delay=100)]),
        g_case("an unkeyed write answered 503 is the policy's to judge",
               [g_begin(), g_attempted(fail(status=503)), g_verdict("retry", delay=100)],
               comment="An answer arrived: whether it means the write ran is the component's reading (it checks status)."),
        g_case("a keyed write that timed out may be resent", [g_begin(key="k-1"), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)]),
        g_case("a write the hints call idempotent may be resent",
               [g_begin(hints=IDEMPOTENT_HINTS), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)]),
        g_case("a read that timed out may be resent",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)]),
        g_case("a delete that timed out may be resent",
               [g_begin("cancel_order"), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)],
               config={"tools": {"cancel_order": {"effect": "delete"}}}),
        g_case("the configuration's effect wins over read-only hints",
               [g_begin(hints=READ_HINTS), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)],
               "unknown-write-resent", 2, config={"tools": {"issue_refund": {"effect": "write"}}}),
        g_case("the configuration's readOnlyHint makes a read",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)],
               config={"tools": {"issue_refund": {"readOnlyHint": True}}}),
        g_case("an entry with only timeouts leaves the effect to the hints",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)],
               "unknown-write-resent", 2, config={"tools": {"issue_refund": {"idle-timeout-ms": 5000}}}),
        g_case("default-effect read makes an unknown tool a read",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)], config={"default-effect": "read"}),
        g_case("default-effect read with hints that are not read-only is a write",
               [g_begin(hints={"read-only": False, "destructive": None, "idempotent": None}), g_attempted(TIMED_OUT), g_verdict("retry", delay=100)],
               "unknown-write-resent", 2, config={"default-effect": "read"}),
        # key-changed and verdict-disagrees
        g_case("a decision whose retry names another key",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=100), g_decision("retry", delay=100, key="forged")],
               "key-changed", 3),
        g_case("a decision with the call's key agrees",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=100), g_decision("retry", delay=100, key="k-1")]),
        g_case("a decision that retries where the verdict escalated",
               [g_begin(key="k-1"), g_attempted(fail(status=403)), g_verdict("escalate"), g_decision("retry", delay=100, key="k-1")],
               "verdict-disagrees", 3),
        g_case("a decision with another delay than the verdict",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=100), g_decision("retry", delay=200, key="k-1")],
               "verdict-disagrees", 3),
        g_case("a decision that asks for a new session where the verdict did not",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=100), g_decision("retry", delay=100, reconnect=True, key="k-1")],
               "verdict-disagrees", 3),
        # delay-over-cap
        g_case("a retry that waits 30 days", [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=2_592_000_000)],
               "delay-over-cap", 2),
        g_case("a retry at max-delay-ms", [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=30_000)]),
        g_case("a retry 1 ms over max-delay-ms", [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=30_001)],
               "delay-over-cap", 2),
        g_case("a hinted retry may wait up to max-hint-ms",
               [g_begin(key="k-1"), g_attempted(fail(status=503, headers=[("retry-after", "60")])), g_verdict("retry", delay=60_000, hint=60_000)]),
        g_case("a hinted retry 1 ms over max-hint-ms",
               [g_begin(key="k-1"), g_attempted(fail(status=503, headers=[("retry-after", "60")])), g_verdict("retry", delay=60_001, hint=60_001)],
               "delay-over-cap", 2),
        g_case("aws-2026: a hinted retry may wait up to max-delay-ms plus the hint cap",
               [g_begin(key="k-1"), g_attempted(fail(status=503, headers=[("retry-after", "3600")])), g_verdict("retry", delay=25_000, hint=3_600_000)],
               config={"preset": "aws-2026"}, comment="hint-cap-over-backoff-ms 5000 over max-delay-ms 20000: the policy never waits longer"),
        g_case("aws-2026: a hinted retry 1 ms over max-delay-ms plus the hint cap",
               [g_begin(key="k-1"), g_attempted(fail(status=503, headers=[("retry-after", "3600")])), g_verdict("retry", delay=25_001, hint=3_600_000)],
               "delay-over-cap", 2, config={"preset": "aws-2026"}),
        g_case("aws-2026: an unhinted retry over its max-delay-ms of 20 s",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=20_001)],
               "delay-over-cap", 2, config={"preset": "aws-2026"}),
        g_case("aws-2026: a fourth attempt of one call",
               [g_begin(key="k-1")] + [e for n in range(1, 4) for e in (g_attempted(fail(status=503)), g_verdict("retry", attempt=n, delay=100))],
               "attempts-over-budget", 6, config={"preset": "aws-2026"}, comment="the preset's max-attempts-per-call is 3"),
        g_case("a hint cap of its own lets a hinted retry wait max-delay-ms plus it",
               [g_begin(key="k-1"), g_attempted(fail(status=429, headers=[("retry-after", "120")])), g_verdict("retry", delay=90_000, hint=120_000)],
               config={"hint-cap-over-backoff-ms": 60_000}),
        g_case("a retry that waits an hour under a configuration that allows a day",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=3_600_000)],
               config={"max-delay-ms": 86_400_000}),
        g_case("an account wait may exceed max-delay-ms up to max-wait-ms",
               [g_begin(key="k-1", delay=20_000), g_attempted(fail(status=503)), g_verdict("retry", delay=40_000)],
               config={"account-budget": {"account-id": "acct", "capacity": 10, "refill-interval-ms": 1000, "max-wait-ms": 40_000}}),
        g_case("a first send delayed without an account budget", [g_begin(key="k-1", delay=5000)], "delay-over-cap", 0),
        g_case("a first send delayed past the account's max-wait-ms", [g_begin(key="k-1", delay=5001)], "delay-over-cap", 0,
               config={"account-budget": {"account-id": "acct", "capacity": 10, "refill-interval-ms": 1000}}),
        g_case("a poll at the server's interval up to max-hint-ms",
               [g_begin(key="k-1"), g_attempted({"task": {"task-id": "t-1", "status": "working", "poll-interval-ms": 60_000}}),
                g_verdict("poll", delay=60_000)]),
        g_case("a poll after an hour", [g_begin(key="k-1"), g_attempted({"task": {"task-id": "t-1", "status": "working"}}), g_verdict("poll", delay=3_600_000)],
               "delay-over-cap", 2),
        # attempts-over-budget
        g_case("a fifth attempt of one call",
               [g_begin(key="k-1")] + [e for n in range(1, 5) for e in (g_attempted(fail(status=503)), g_verdict("retry", attempt=n, delay=100))],
               "attempts-over-budget", 8),
        g_case("the guard counts attempts, not the verdict's claim",
               [g_begin(key="k-1")] + [e for n in range(1, 5) for e in (g_attempted(fail(status=503)), g_verdict("retry", attempt=1, delay=100))],
               "attempts-over-budget", 8),
        g_case("a fourth attempt under max-attempts-per-call 4",
               [g_begin(key="k-1")] + [e for n in range(1, 4) for e in (g_attempted(fail(status=503)), g_verdict("retry", attempt=n, delay=100))]),
        g_case("an eleventh retry in a run",
               [e for n in range(6) for e in (g_begin(f"tool_{n}", key=f"k-{n}"), g_attempted(fail(status=503)), g_verdict("retry", delay=100),
                                                g_attempted(fail(status=503)), g_verdict("retry", attempt=2, delay=100))],
               "attempts-over-budget", 27, config={"max-steps-per-run": 1000}),
        g_case("a call begun when the run's steps are spent",
               [g_begin("lookup_order", hints=READ_HINTS), g_attempted(SUCCESS), g_verdict("succeed"),
                g_begin("lookup_order", hints=READ_HINTS), g_attempted(SUCCESS), g_verdict("succeed"), g_begin("lookup_order", hints=READ_HINTS)],
               "attempts-over-budget", 6, config={"max-steps-per-run": 2}),
        g_case("a status check past the run's steps",
               [g_begin(), g_attempted(TIMED_OUT), g_verdict("check-status")], "attempts-over-budget", 2, config={"max-steps-per-run": 1}),
        g_case("two calls interleaved keep their own facts",
               [g_begin("lookup_order", hints=READ_HINTS), g_begin(key="k-2"), g_attempted(fail(status=403), call=0),
                g_attempted(fail(status=503), call=1), g_verdict("retry", delay=100, call=1), g_verdict("retry", delay=100, call=0)],
               "client-error-repeated", 5),
        g_case("a value the guard cannot read takes the default",
               [g_begin(key="k-1"), g_attempted(fail(status=503)), g_verdict("retry", delay=30_001)],
               "delay-over-cap", 2, config={"max-delay-ms": "an hour"},
               comment="The policy refuses such a configuration at load; the guard never fails on one."),
        # a 4xx the server itself says to retry (the component reads what each signal means)
        g_case("a 409 with x-should-retry true may be retried",
               [g_begin(key="k-1"), g_attempted(fail(status=409, headers=[("x-should-retry", "true")])), g_verdict("retry", delay=100)]),
        g_case("a 403 with x-should-retry false retried as it was",
               [g_begin(key="k-1"), g_attempted(fail(status=403, headers=[("X-Should-Retry", "false")])), g_verdict("retry", delay=100)],
               "client-error-repeated", 2),
        g_case("a 400 with an AWS error type may be retried",
               [g_begin(key="k-1"), g_attempted(fail(status=400, headers=[("x-amzn-ErrorType", "ThrottlingException")])), g_verdict("retry", delay=100)]),
        g_case("a 403 from an overloaded Envoy may be retried",
               [g_begin(key="k-1"), g_attempted(fail(status=403, headers=[("x-envoy-overloaded", "true")])), g_verdict("retry", delay=100)]),
        g_case("a 400 with a gRPC status may be retried",
               [g_begin(key="k-1"), g_attempted(fail(status=400, headers=[("grpc-status", "14")])), g_verdict("retry", delay=100)]),
        # a new session is a retry of another request only for the statuses that refuse a session
        g_case("a 403 with a session id retried on a new session",
               [g_begin(key="k-1"), g_attempted(fail(status=403, session=True)), g_verdict("retry", reconnect=True)],
               "client-error-repeated", 2),
        g_case("a 404 with a session id retried on new sessions three times",
               [g_begin("lookup_order", hints=READ_HINTS)]
               + [e for n in range(1, 4) for e in (g_attempted(fail(status=404, session=True)), g_verdict("retry", attempt=n, reconnect=True))]),
        # tasks
        g_case("a tool called again while its task lives",
               [g_begin(key="k-1"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled({"poll-failure": failure(transport="connection-reset", delivery="sent")}), g_verdict("retry", delay=100)],
               "task-resent", 4),
        g_case("an unkeyed write's task whose poll failed, called again",
               [g_begin("archive_orders"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled({"poll-failure": failure(transport="connection-reset", delivery="sent")}), g_verdict("retry", delay=100)],
               "task-resent", 4),
        g_case("a task that failed may be retried as a new call",
               [g_begin(key="k-1"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled(fail(status=503)), g_verdict("retry", delay=100)]),
        g_case("an unkeyed write whose task was cancelled, resent without a status check",
               [g_begin("archive_orders"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled(g_task("cancelled")), g_verdict("retry", delay=100)],
               "unknown-write-resent", 4),
        g_case("an unkeyed write whose task the policy stopped, then checked absent and resent",
               [g_begin("archive_orders"), g_attempted(g_task("working")), g_verdict("check-status", cancel_task=True),
                g_check("absent"), g_verdict("retry", delay=100)]),
        g_case("an unkeyed write whose task completed, then retried after a 503",
               [g_begin("archive_orders"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled(fail(status=503)), g_verdict("retry", delay=100)],
               comment="The task's end is an answer: whether the write ran is the policy's reading."),
        g_case("a task failed with invalid params, retried as it was",
               [g_begin(key="k-1"), g_attempted(g_task("working")), g_verdict("poll", delay=1000),
                g_polled(fail(rpc=-32602)), g_verdict("retry", delay=100)],
               "client-error-repeated", 4),
        g_case("the 3rd poll under max-polls-per-task 2",
               [g_begin(key="k-1"), g_attempted(g_task("working")), g_verdict("poll", delay=100), g_polled(g_task("working")),
                g_verdict("poll", delay=100), g_polled(g_task("working")), g_verdict("poll", delay=100)],
               "attempts-over-budget", 6, config={"max-polls-per-task": 2}),
    ]

# ---------- fleet/revisions.json: the one revision parser of every host ----------

def revision_cases():
    ok = lambda text, value, d: {"description": d, "text": text, "revision": value}
    bad = lambda text, d: {"description": d, "text": text, "revision": None}
    return [
        ok("1", 1, "the first revision"),
        ok("1764460800000", 1764460800000, "a revision that is the server's time in ms"),
        ok("9007199254740991", 2**53 - 1, "the largest revision, 2^53 - 1"),
        bad("9007199254740992", "2^53 is past the largest revision"),
        bad("9223372036854775807", "i64::MAX is past the largest revision"),
        bad("18446744073709551616", "2^64 is not a revision"),
        bad("-5", "a negative number is not a revision"),
        bad("0", "0 is not a stored revision (absent is nothing published)"),
        bad("007", "a leading zero is refused"),
        bad("+7", "a sign is refused"),
        bad(" 7", "a space is refused"),
        bad("7 ", "a trailing space is refused"),
        bad("0x10", "hexadecimal is refused"),
        bad("1e3", "an exponent is refused"),
        bad("12.0", "a fraction is refused"),
        bad("", "an empty value is refused"),
        bad("twelve", "words are refused"),
        bad("١٢", "digits of another script are refused"),
        bad("99999999999999999999999999999999", "32 digits are refused"),
    ]


FILES = {
    "classify.json": ("How each failure is classified (classify)", classify_cases),
    "hints.json": ("Server wait hints from every header format (classify)", hints_cases),
    "backoff.json": ("Full-jitter backoff with the hint as a floor (next-delay)", backoff_cases),
    "keys.json": ("Idempotency keys (derive-idempotency-key)", keys_cases),
    "runs-transient.json": ("Transient failures and ambiguous writes in a run", transient_cases),
    "runs-deterministic.json": ("Deterministic failures are shown to the model", deterministic_cases),
    "runs-permission.json": ("Permission failures escalate at once", permission_cases),
    "runs-semantic.json": ("Empty or unusable results", semantic_cases),
    "runs-unclassified.json": ("Failures the policy cannot classify", unclassified_cases),
    "runs-delete.json": ("Deletes", delete_cases),
    "runs-hints.json": ("Server hints in a run", run_hint_cases),
    "runs-budgets.json": ("Budgets: per call, per run, step budget", budget_cases),
    "article-test-policy.json": ("The test_policy checks of "+'"Agent Retry Policies: When to Retry a Tool, Replan the Task or Give Up"', article_cases),
    "runs-errors.json": ("Host misuse of a run is a typed error", run_error_cases),
    "account-budget.json": ("The shared account budget", account_cases),
    "config.json": ("Configuration loading and validation (load-policy)", config_cases),
    "tool-errors.json": ("Failures a tool relays as isError text or structured content (classify)", tool_error_cases),
    "runs-tool-errors.json": ("Relayed failures in a run", tool_error_run_cases),
    "limits.json": ("Bounded inputs and outputs, and one report per attempt (contract 0.3.0)", limits_cases),
    "runs-transport.json": ("Sessions, revisions, TLS, names and deadlines (contract 0.5.0)", transport_cases),
    "runs-tasks.json": ("Tasks, continuations, expired handles and timeouts of MCP 2026-07-28 (contract 0.6.0)", task_cases),
    "runs-abandon.json": ("Calls the host stopped: cancelled, or past their deadline (contract 0.7.0)", abandon_cases),
    "breakers.json": ("Circuit breakers shared through the host's state (contract 0.8.0)", breaker_cases),
    "resume.json": ("An escalation a person answers, and the run resumed from its snapshot (contract 0.9.0)", resume_cases),
    "retry-budgets.json": ("The ratio retry budget and the aws-2026 preset (contract 0.9.0)", retry_budget_cases),
    "gate.json": ("The invariants every live update must keep: the update gate runs them on the candidate", gate_cases),
    "observations.json": ("Raw transport observations and what each means, replayed through each host's wrapper", observation_cases),
}
# A file whose cases share one configuration.
FILE_CONFIG = {"observations.json": OBSERVATION_CONFIG}


def check_style(name, doc):
    problems = []
    seen = set()
    for c in doc["cases"]:
        d = c["description"]
        if d in seen:
            problems.append(f"{name}: duplicate description {d!r}")
        seen.add(d)
        if "should" in d.split() or d.lower().startswith("test"):
            problems.append(f"{name}: say what happens, not 'should'/'test': {d!r}")
        if len(d) > 100:
            problems.append(f"{name}: description over 100 characters: {d!r}")
    return problems


def main():
    fix_key_hashes()
    check = "--check" in sys.argv
    problems, total = [], 0
    for name, (description, build) in FILES.items():
        doc = {"description": description}
        if name in FILE_CONFIG:
            doc["config"] = FILE_CONFIG[name]
        doc["cases"] = build()
        total += len(doc["cases"])
        problems += check_style(name, doc)
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        path = HERE / name
        if check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                problems.append(f"{name} is out of date: run python3 tests/vectors/make_vectors.py")
        else:
            path.write_text(text, encoding="utf-8")
    revisions = {"description": "The fleet's revisions: what every host's parser reads (a number) or refuses (null)", "cases": revision_cases()}
    total += len(revisions["cases"])
    problems += check_style("fleet/revisions.json", revisions)
    text = json.dumps(revisions, indent=1, ensure_ascii=False) + "\n"
    path = HERE / "fleet" / "revisions.json"
    if check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            problems.append("fleet/revisions.json is out of date: run python3 tests/vectors/make_vectors.py")
    else:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    guard = {"description": "What every wrapper enforces, whatever the policy says (the run-time guard)", "cases": guard_cases()}
    total += len(guard["cases"])
    problems += check_style("guard/guard.json", guard)
    text = json.dumps(guard, indent=1, ensure_ascii=False) + "\n"
    path = HERE / GUARD_DIR / "guard.json"
    if check:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            problems.append(f"guard/guard.json is out of date: run python3 tests/vectors/make_vectors.py")
    else:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for p in problems:
        print(p)
    print(f"{total} cases in {len(FILES) + 2} files")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
