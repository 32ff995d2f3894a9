"""A policy published once in Redis for a whole fleet of workers (issue 8): the
same layout as the Rust host's `agent_retry_host::fleet`.

- `{prefix}:wasm`: the component's bytes;
- `{prefix}:config`: the configuration (JSON text);
- `{prefix}:wasm.sig`: optional detached Ed25519 signature of the `.wasm` (64 raw
  bytes or 128 hex digits);
- `{prefix}:vectors`: optional conformance vectors (JSON text, the format of
  tests/vectors) that every worker runs against the publication before taking
  it (`live.py`'s gate; a case without `config` runs in the published one);
- `{prefix}:revision`: an integer that grows with every publication: one more
  than the last, or the server's time in ms if that is larger, so that it never
  repeats after Redis loses its state;
- channel `{prefix}:updates`: a message per publication (it only wakes workers).

`publish_policy` writes all of it in one transaction (MULTI, SET wasm, SET
config, SET or DEL wasm.sig, SET or DEL vectors, INCR revision, PUBLISH, EXEC), so a worker reading
with one `MGET` never sees a `.wasm` of one publication with the configuration
of another. A worker (`LivePolicy.open_redis`) learns of an update from the
channel at once, and from polling `{prefix}:revision` otherwise (a missed
message, a reconnection, a worker that was down): either way it reads the
revision it has not tried yet and puts it through the same gate as a file update.

Needs redis-py: `pip install 'agent-retry-policy[fleet]'`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_PREFIX = "agent-retry:policy"
# How long a Redis command may take before it counts as a failure (connect, read, write).
REDIS_TIMEOUT_S = 2.0


def _redis() -> Any:
    try:
        import redis
    except ImportError as e:
        raise ImportError("policy updates through Redis need redis-py: pip install 'agent-retry-policy[fleet]'") from e
    return redis


@dataclass(frozen=True)
class Publication:
    """One publication, as read in one MGET."""

    wasm: bytes
    config: bytes
    signature: bytes | None
    revision: int
    vectors: bytes | None = None


class FleetUnavailable(Exception):
    """Redis cannot be reached or answered wrongly, or nothing is published there."""


@dataclass(frozen=True)
class FleetSource:
    """Where a fleet's policy is published: `redis://host:port/db` and the keys' prefix."""

    url: str
    prefix: str = DEFAULT_PREFIX
    timeout_s: float = REDIS_TIMEOUT_S

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"

    @property
    def channel(self) -> str:
        """The channel a publication is announced on."""
        return self.key("updates")

    def client(self) -> Any:
        """A redis-py client (a connection pool; thread-safe)."""
        return _redis().Redis.from_url(self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s)

    def revision(self, client: Any) -> int:
        """The current revision (0: nothing published yet). Raises `FleetUnavailable`."""
        try:
            value = client.get(self.key("revision"))
        except _redis().RedisError as e:
            raise FleetUnavailable(f"{self.url}: {e}") from e
        return _revision(value, self.key("revision"))

    def read(self, client: Any) -> Publication:
        """The published policy, read in one MGET (one publication's parts).
        Raises `FleetUnavailable`."""
        try:
            wasm, config, signature, revision, vectors = client.mget(
                self.key("wasm"), self.key("config"), self.key("wasm.sig"), self.key("revision"), self.key("vectors")
            )
        except _redis().RedisError as e:
            raise FleetUnavailable(f"{self.url}: {e}") from e
        for value, name in ((wasm, "wasm"), (config, "config")):
            if value is None:
                raise FleetUnavailable(f"nothing published at {self.key(name)} (publish_policy writes it)")
        return Publication(
            bytes(wasm),
            bytes(config),
            bytes(signature) if signature is not None else None,
            _revision(revision, self.key("revision")),
            bytes(vectors) if vectors is not None else None,
        )


def _revision(value: Any, key: str) -> int:
    if value is None:
        return 0
    try:
        return int(value)
    except (TypeError, ValueError):
        raise FleetUnavailable(f"{key} is not an integer: {value!r}") from None


# The next revision: INCR, or the server's time in ms if larger (the same script
# as the Rust and Node hosts' publishers).
NEXT_REVISION_LUA = "local r = redis.call('INCR', KEYS[1]) local t = redis.call('TIME') local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) if r < ms then redis.call('SET', KEYS[1], ms) r = ms end return r"


def publish_policy(
    url: str,
    wasm_bytes: bytes,
    config_json: str,
    signature: bytes | str | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    vectors: str | bytes | None = None,
) -> int:
    """Publishes a policy for every worker of the fleet in one transaction and
    announces it; returns the new revision. `signature`: the detached Ed25519
    signature of `wasm_bytes` (64 bytes, or 128 hex digits), or None (the old one
    is deleted). `vectors`: conformance vectors (JSON text in the format of
    tests/vectors) every worker runs against this publication before taking it,
    or None (the old ones are deleted). Workers gate it as any update: a worker refuses what does not
    pass and keeps its last good policy."""
    source = FleetSource(url, prefix)
    client = source.client()
    try:
        pipe = client.pipeline(transaction=True)
        pipe.set(source.key("wasm"), bytes(wasm_bytes))
        pipe.set(source.key("config"), config_json.encode("utf-8"))
        if signature is None:
            pipe.delete(source.key("wasm.sig"))
        else:
            pipe.set(source.key("wasm.sig"), signature.encode("ascii") if isinstance(signature, str) else bytes(signature))
        if vectors is None:
            pipe.delete(source.key("vectors"))
        else:
            pipe.set(source.key("vectors"), vectors.encode("utf-8") if isinstance(vectors, str) else bytes(vectors))
        pipe.eval(NEXT_REVISION_LUA, 1, source.key("revision"))
        pipe.publish(source.channel, b"published")
        results = pipe.execute()
    finally:
        client.close()
    return int(results[-2])  # the revision script's answer (PUBLISH's is last)


__all__ = ["DEFAULT_PREFIX", "FleetSource", "FleetUnavailable", "Publication", "publish_policy"]
