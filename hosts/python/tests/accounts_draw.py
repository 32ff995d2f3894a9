"""One worker of the cross-host account test (test_redis_accounts.py and
hosts/typescript/test/redis-accounts.test.ts; its Node twin is
hosts/typescript/test/accounts-draw.ts): connects a `SharedAccounts` to Redis,
prints `ready`, reads the common start (epoch ms) from stdin, then asks for one
token at a time (max wait 0) until the end, and prints one JSON line: {"host",
"grants": [epoch ms of each token granted], "asked", "fallbacks"}.

    python accounts_draw.py URL ACCOUNT CAPACITY INTERVAL_MS WORKERS DURATION_MS
"""

from __future__ import annotations

import json
import sys
import time

from agent_retry_policy.accounts import Bucket
from agent_retry_policy.redis_accounts import SharedAccounts


def main(url: str, account: str, capacity: str, interval_ms: str, workers: str, duration_ms: str) -> None:
    accounts = SharedAccounts.open(url, workers=int(workers))
    bucket = Bucket(int(capacity), int(interval_ms))
    print("ready", flush=True)
    start = int(sys.stdin.readline())
    end = start + int(duration_ms)
    while time.time() * 1000 < start:
        time.sleep(0.001)
    grants: list[int] = []
    asked = 0
    while (now := int(time.time() * 1000)) < end:
        asked += 1
        if accounts.reserve(account, 1, bucket, 0, now).granted:
            grants.append(int(time.time() * 1000))
        time.sleep(0.003)
    print(json.dumps({"host": "python", "grants": grants, "asked": asked, "fallbacks": accounts.fallbacks}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:7])
