"""Which of Triton's own APIs need a secret header, and the header that opens them.

Triton's HTTP and gRPC ports answer everyone who can reach them: without this, any local client
(or a web page POSTing to 127.0.0.1) could register shared-memory regions, change the log
settings, read trace settings and statistics, or list the repository. tritonserver >= 2.41 closes
API groups to requests without a given header key/value (`--http-restricted-api`,
`--grpc-restricted-protocol`); `TritonServer` passes both, with these defaults:

    HTTP  shared-memory, model-repository, statistics, trace, logging
    gRPC  shared-memory, statistics, trace, logging

health, metadata, inference and model-config stay open everywhere: the launcher's readiness
check, DFlashClient, the OpenAI front end (model configs and, over gRPC, the repository index)
and `bench --url` (model config over HTTP) use them without a header.

The header value is a token, not the API key itself: Triton takes it on its command line, which
`ps` shows to every user of the machine, and the API key must not leak that way (the docs say to
pass it in DFLASH_API_KEY for exactly that reason). With a key the token is
HMAC-SHA256(key, "dflash-trt triton admin"), so key holders derive it
(`python -m trtllm_dflash.serving.triton_access` prints the header for $DFLASH_API_KEY); without
a key it is random per server and told to nobody. Either way, users of the machine who can list
its processes can read it: the restriction keeps out clients that reach the ports but not the
process list (browser pages, other hosts with --host 0.0.0.0, containers sharing the network).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sys
from typing import Sequence

from trtllm_dflash.errors import DFlashError

# Triton's names for its API groups (tritonserver --help, 2.41 to 2.51 at least).
API_GROUPS = ("health", "metadata", "inference", "shared-memory", "model-config", "model-repository", "statistics", "trace", "logging")
# Groups our own tools call without a header: restricting one breaks them, so it is refused.
MUST_STAY_OPEN = ("health", "metadata", "inference")
HTTP_RESTRICTED = ("shared-memory", "model-repository", "statistics", "trace", "logging")
# model-repository stays open on gRPC: the OpenAI front end lists the repository there (no header)
GRPC_RESTRICTED = ("shared-memory", "statistics", "trace", "logging")
HEADER = "dflash-admin-token"
GRPC_HEADER = f"triton-grpc-protocol-{HEADER}"  # Triton prefixes gRPC restriction keys with this
API_KEY_ENV = "DFLASH_API_KEY"
_TOKEN_CONTEXT = b"dflash-trt triton admin"


def restricted_groups(value: str | Sequence[str], option: str) -> tuple[str, ...]:
    """Check a group list ("a,b", a sequence, or "none"); a typo must not silently open an API."""
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [name.strip().lower() for name in names if name.strip()]
    if names == ["none"]:
        return ()
    groups: list[str] = []
    for name in names:
        if name not in API_GROUPS:
            raise DFlashError(f"{option}: {name!r} is not a Triton API group",
                              f"name some of {', '.join(g for g in API_GROUPS if g not in MUST_STAY_OPEN)}, or none")
        if name in MUST_STAY_OPEN:
            raise DFlashError(f"{option}: {name!r} cannot be restricted (the readiness check, DFlashClient and the OpenAI front end call it without a header)",
                              f"leave {name} out")
        if name not in groups:
            groups.append(name)
    return tuple(groups)


def admin_token(api_key: str | None) -> str:
    """The header value: derived from the API key (key holders can compute it), else random."""
    if not api_key:
        return secrets.token_hex(32)
    return hmac.new(api_key.encode(), _TOKEN_CONTEXT, hashlib.sha256).hexdigest()


def restriction_args(http: Sequence[str], grpc: Sequence[str], token: str, with_http: bool = True) -> list[str]:
    """tritonserver flags closing `http` / `grpc` groups to requests without `HEADER: token`."""
    args = []
    if http and with_http:
        args.append(f"--http-restricted-api={','.join(http)}:{HEADER}={token}")
    if grpc:
        args.append(f"--grpc-restricted-protocol={','.join(grpc)}:{HEADER}={token}")
    return args


def http_headers(token: str) -> dict[str, str]:
    """Headers for a restricted HTTP request (tritonclient.http `headers=`, curl -H)."""
    return {HEADER: token}


def grpc_headers(token: str) -> dict[str, str]:
    """Metadata for a restricted gRPC call (tritonclient.grpc `headers=`)."""
    return {GRPC_HEADER: token}


def main() -> int:
    """Print the HTTP header for $DFLASH_API_KEY: `curl -H "$(python -m ...triton_access)" ...`."""
    api_key = os.environ.get(API_KEY_ENV)
    if not api_key:
        print(f"{API_KEY_ENV} is not set: without a key Triton's restricted APIs are open to nobody", file=sys.stderr)
        return 2
    print(f"{HEADER}: {admin_token(api_key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
