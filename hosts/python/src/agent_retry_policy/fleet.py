"""A policy published once in Redis for a whole fleet of workers (issue 8): the
same layout as the Rust host's `agent_retry_host::fleet`.

- `{prefix}:wasm`: the component's bytes;
- `{prefix}:config`: the configuration (JSON text);
- `{prefix}:manifest`: optional signed manifest (`manifest.py`): one Ed25519
  signature over the `.wasm`'s digest, the configuration's, the vectors' and
  the revision; under a key a worker takes nothing else (a `{prefix}:wasm.sig`
  of before 0.7, over the `.wasm` alone, is not accepted, and every
  publication deletes it);
- `{prefix}:vectors`: optional conformance vectors (JSON text, the format of
  tests/vectors) that every worker runs against the publication before taking
  it (`live.py`'s gate; a case without `config` runs in the published one);
- `{prefix}:revision`: an integer that grows with every publication: one more
  than the last, or the server's time in ms if that is larger, so that it never
  repeats after Redis loses its state; a signed publication is stored under
  its manifest's revision exactly, which must be greater. Decimal digits from 1 to `MAX_REVISION`
  (2^53 - 1), read by `parse_revision`, the rule the Rust and Node hosts share
  (tests/vectors/fleet/revisions.json); anything else stored there is refused,
  never read as some number;
- channel `{prefix}:updates`: a message per publication (it only wakes workers).

`publish_policy` writes all of it in one script (`PUBLISH_LUA`, generated from
the Rust host's `fleet.rs`: EVALSHA, EVAL if the server does not have it yet),
which checks the stored revision before it writes anything: a worker reading
with one `MGET` never sees a `.wasm` of one publication with the configuration
of another, and a publication that fails (a stored revision that is not one, or
the largest there is) writes nothing. A worker (`LivePolicy.open_redis`) learns of an update from the
channel at once, and from polling `{prefix}:revision` otherwise (a missed
message, a reconnection, a worker that was down): either way it reads the
revision it has not tried yet and puts it through the same gate as a file update.

Needs redis-py: `pip install 'agent-retry-policy[fleet]'`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .fleet_scripts import MAX_REVISION, PUBLISH_LUA

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
    manifest: bytes | None  # the signed manifest, `{prefix}:manifest`
    revision: int  # 0 when nothing is stored at `{prefix}:revision`
    vectors: bytes | None = None
    legacy_signature: bool = False  # a signature over the .wasm alone is at `{prefix}:wasm.sig` (before 0.7)


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
        """The current revision (0: nothing published yet). Raises `FleetUnavailable`,
        also for a stored value that is not a revision (`parse_revision`), naming
        the key and the value."""
        try:
            value = client.get(self.key("revision"))
        except _redis().RedisError as e:
            raise FleetUnavailable(f"{self.url}: {e}") from e
        return _revision(value, self.key("revision"))

    def read(self, client: Any) -> Publication:
        """The published policy, read in one MGET (one publication's parts).
        Raises `FleetUnavailable`."""
        try:
            wasm, config, manifest, revision, vectors, legacy = client.mget(
                self.key("wasm"), self.key("config"), self.key("manifest"), self.key("revision"), self.key("vectors"), self.key("wasm.sig")
            )
        except _redis().RedisError as e:
            raise FleetUnavailable(f"{self.url}: {e}") from e
        for value, name in ((wasm, "wasm"), (config, "config")):
            if value is None:
                raise FleetUnavailable(f"nothing published at {self.key(name)} (publish_policy writes it)")
        return Publication(
            bytes(wasm),
            bytes(config),
            bytes(manifest) if manifest is not None else None,
            _revision(revision, self.key("revision")),
            bytes(vectors) if vectors is not None else None,
            legacy is not None,
        )


def parse_revision(text: bytes | str) -> int:
    """The one revision rule, the Rust and Node hosts' too (checked against
    tests/vectors/fleet/revisions.json): decimal ASCII digits, no sign, space or
    leading zero, from 1 to `MAX_REVISION` (2^53 - 1). Anything else raises
    `ValueError` saying what it is, never read as some number."""
    raw = text.encode("utf-8", "replace") if isinstance(text, str) else bytes(text)
    if 0 < len(raw) <= 16 and raw[:1] != b"0" and all(0x30 <= b <= 0x39 for b in raw):
        revision = int(raw)
        if revision <= MAX_REVISION:
            return revision
    shown = json.dumps(raw[:40].decode("utf-8", "replace"), ensure_ascii=False)
    raise ValueError(f"{shown} is not a revision (decimal digits from 1 to {MAX_REVISION})")


def _revision(value: Any, key: str) -> int:
    """A stored revision (0 when absent); `FleetUnavailable` naming the key and
    the value when it is not one."""
    if value is None:
        return 0
    try:
        return parse_revision(value)
    except (TypeError, ValueError) as e:
        raise FleetUnavailable(f"{key}: {e}") from None


def publish_policy(
    url: str,
    wasm_bytes: bytes,
    config_json: str,
    manifest: bytes | str | None = None,
    *,
    prefix: str = DEFAULT_PREFIX,
    vectors: str | bytes | None = None,
) -> int:
    """Publishes a policy for every worker of the fleet in one script
    (`PUBLISH_LUA`) and announces it; returns the new revision. `manifest`: the
    signed manifest (`manifest.sign_publication`, with a revision), or None
    (unsigned: the old one is deleted). A signed publication is stored under
    the manifest's revision exactly; it is refused before anything is written
    (`ManifestError`, a ValueError) when the manifest is malformed, has
    revision none (signed for files), or does not cover `wasm_bytes`,
    `config_json` and `vectors`. `vectors`: conformance vectors (JSON text in
    the format of tests/vectors) every worker runs against this publication
    before taking it, or None (the old ones are deleted). A signature over the
    .wasm alone (`{prefix}:wasm.sig`, before 0.7) is always deleted. The script
    checks the stored revision before it writes anything: one that is not a
    revision (`parse_revision`), `MAX_REVISION` (unsigned), or one not lower
    than the manifest's fails the publication and nothing is written. Raises
    `FleetUnavailable` when the publication fails (the script's refusal says
    "nothing was written"; a connection or timeout error says what redis-py
    said). Workers gate it as any update: a worker refuses what does not pass,
    or a revision lower than the one it serves (`UpdateOlderError`), and keeps
    its last good policy."""
    from .manifest import ManifestError, check_covers, parse_manifest

    def given(value: str | bytes | None) -> bytes:
        if value is None:
            return b""
        return value.encode("utf-8") if isinstance(value, str) else bytes(value)

    wanted = ""
    if manifest is not None:
        at = "the manifest to publish"
        parsed = parse_manifest(manifest, at)
        try:
            check_covers(parsed, at, bytes(wasm_bytes), config_json, vectors)
        except ManifestError as e:
            raise ManifestError("mismatch", f"{e}: nothing was written") from None
        if parsed.revision is None:
            raise ManifestError(
                "malformed",
                f"{at} has revision none (signed for files): sign it with a revision to publish it to a fleet; nothing was written",
            )
        wanted = str(parsed.revision)
    source = FleetSource(url, prefix)
    client = source.client()
    try:
        publish = client.register_script(PUBLISH_LUA)  # EVALSHA, EVAL on NOSCRIPT
        revision = publish(
            keys=[
                source.key("wasm"),
                source.key("config"),
                source.key("manifest"),
                source.key("vectors"),
                source.key("revision"),
                source.key("wasm.sig"),
            ],
            args=[
                bytes(wasm_bytes),
                config_json.encode("utf-8"),
                given(manifest),
                given(vectors),
                source.channel,
                "0" if manifest is None else "1",
                "0" if vectors is None else "1",
                wanted,
            ],
        )
    except _redis().RedisError as e:
        raise FleetUnavailable(f"{url}: the publication failed: {e}") from e
    finally:
        client.close()
    return int(revision)


__all__ = ["DEFAULT_PREFIX", "MAX_REVISION", "FleetSource", "FleetUnavailable", "Publication", "parse_revision", "publish_policy"]
