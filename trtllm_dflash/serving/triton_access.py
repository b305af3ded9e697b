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

The header value is a random token, new for every server, never a function of an API key (it
was once HMAC(key, constant): anyone who read it could test guesses of the key offline). Triton
takes it on its command line only, so local users who can list processes can read it there; it
opens Triton's admin APIs, nothing else. Operators read it from a file only its owner can read,
in the server's private folder (`serve` prints the path; `python -m
trtllm_dflash.serving.triton_access FILE` prints the header). The restriction keeps out clients
that reach the ports but not the process list (browser pages, other hosts with --host 0.0.0.0,
containers sharing the network); with `serve --openai-port`, Triton's ports listen on loopback.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path
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
TOKEN_FILE = "admin-token"  # in the server's private folder, mode 0600


def restricted_groups(value: str | Sequence[str], option: str) -> tuple[str, ...]:
    """Check a group list ("a,b", a sequence, or "none"); a typo must not silently open an API."""
    names = value.split(",") if isinstance(value, str) else list(value)
    names = [name.strip().lower() for name in names if name.strip()]
    if names == ["none"]:
        return ()
    groups: list[str] = []
    for name in names:
        if name not in API_GROUPS:
            raise DFlashError(
                f"{option}: {name!r} is not a Triton API group",
                f"name some of {', '.join(g for g in API_GROUPS if g not in MUST_STAY_OPEN)}, or none",
            )
        if name in MUST_STAY_OPEN:
            raise DFlashError(
                f"{option}: {name!r} cannot be restricted "
                "(the readiness check, DFlashClient and the OpenAI front end call it without a header)",
                f"leave {name} out",
            )
        if name not in groups:
            groups.append(name)
    return tuple(groups)


def admin_token() -> str:
    """A new random header value (256 bits)."""
    return secrets.token_hex(32)


def write_token(path: Path, token: str) -> None:
    """Write `token` where only this user can read it (created 0600, never widened by the umask)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")


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


def main(argv: Sequence[str]) -> int:
    """Print the HTTP header from a server's token file: `curl -H "$(python -m ...triton_access FILE)" ...`."""
    if len(argv) != 1:
        print("usage: python -m trtllm_dflash.serving.triton_access TOKEN_FILE  (the path `dflash-trt serve` prints)", file=sys.stderr)
        return 2
    try:
        token = Path(argv[0]).read_text().strip()
    except OSError as exc:
        print(f"cannot read {argv[0]}: {exc.strerror}; pass the admin token file `dflash-trt serve` printed", file=sys.stderr)
        return 2
    print(f"{HEADER}: {token}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
