"""Transient errors of the Cloud Storage emulator: a front before fake-gcs-server that passes every request on
unchanged, unless a rule in $SIM/gcs/faults.json matches it; then it answers as Cloud Storage's JSON API does when
a request may pass later (Cloud Storage "Retry strategy": 408, 429 and 5xx responses are retryable; "HTTP status
and error codes" for the error bodies):

  "kind"      "unavailable": 503 with reason "backendError" ("We encountered an internal error. Please try again.")
              "throttle": 429 with reason "rateLimitExceeded" (a project's or an object's rate of requests)
  "bucket"    the request's bucket (its path holds /b/BUCKET/; absent: any)
  "method"    the request's HTTP method (absent: any)
  "contains"  a text the request's path and query hold, URL-decoded (an object name or a prefix; absent: any)
  "times"     how many matching requests it answers (absent: no limit); "applied" counts them

The front also answers a missing object as Cloud Storage does, where fake-gcs-server says only "Not Found": "No
such object: BUCKET/OBJECT", as text for a media download and in the JSON error (reason "notFound") otherwise
(firebase/firebase-tools PR 3647 shows both answers of storage.googleapis.com). Clients read that text: the google
provider's remote task logs take a 404 without it for a failed read, and refuse to write the log.

The front listens on the port every client knows (TPU_RL_SIM_GCS_PORT) and passes requests to fake-gcs-server on
TPU_RL_SIM_GCS_SERVER_PORT, bodies streamed both ways and not decompressed.

CLI:
  storage_faults.py serve
  storage_faults.py set NAME --kind unavailable|throttle [--bucket B] [--method M] [--contains T] [--times N]
  storage_faults.py list
  storage_faults.py clear [NAME]
"""

import argparse
import json
import os
import re
from pathlib import Path
from urllib.parse import unquote

from .fault_rules import clear_rules, list_rules, put_rule, take_first

SIM = Path(os.environ.get("SIM") or os.environ.get("TPU_RL_SIM_DIR") or Path(__file__).resolve().parent.parent / ".sim")
ANSWERS = {
    "unavailable": (503, "backendError", "We encountered an internal error. Please try again."),
    "throttle": (429, "rateLimitExceeded", "The rate of requests is too high. Please slow down."),
}
#: Request headers not passed on (the front's own connection) and response headers it sets itself.
HOP_HEADERS = {"host", "connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}


def path() -> Path:
    return SIM / "gcs" / "faults.json"


def set_fault(name, kind, bucket=None, method=None, contains=None, times=None):
    if kind not in ANSWERS:
        raise ValueError(f"kind must be one of {', '.join(ANSWERS)}")
    return put_rule(path(), name, kind, bucket=bucket, method=method, contains=contains, times=times)


def list_faults():
    return list_rules(path())


def clear_faults(name=None):
    clear_rules(path(), name)


def take(method: str, request_path: str, query: str = "") -> dict | None:
    """The rule that answers this request (its use counted), or None: the request goes to the emulator."""
    decoded = unquote(f"{request_path}?{query}")

    def matches(rule):
        bucket = rule.get("bucket")
        return (
            (not rule.get("method") or rule["method"] == method)
            and (not bucket or f"/b/{bucket}/" in request_path or request_path.endswith(f"/b/{bucket}"))
            and (not rule.get("contains") or rule["contains"] in decoded)
        )

    taken = take_first(path(), matches)
    return taken[1] if taken else None


def error_body(kind: str) -> bytes:
    status, reason, message = ANSWERS[kind]
    error = {"code": status, "message": message, "errors": [{"message": message, "domain": "global", "reason": reason}]}
    return json.dumps({"error": error}).encode()


#: An object's path in the JSON API: /storage/v1/b/BUCKET/o/OBJECT or /download/storage/v1/b/BUCKET/o/OBJECT.
OBJECT_PATH = re.compile(r"^(?:/download)?/storage/v1/b/([^/]+)/o/(.+)$")


def missing_object(request_path: str, media: bool) -> tuple[str, bytes] | None:
    """Cloud Storage's answer to a request for an object that does not exist: (content type, body); None for a path
    that names no object."""
    match = OBJECT_PATH.match(request_path)
    if not match:
        return None
    message = f"No such object: {match.group(1)}/{unquote(match.group(2))}"
    if media:
        return "text/html", message.encode()
    error = {
        "code": 404,
        "message": message,
        "errors": [{"message": message, "domain": "global", "reason": "notFound"}],
    }
    return "application/json", json.dumps({"error": error}).encode()


def serve(port: int, upstream_port: int) -> None:
    import aiohttp
    from aiohttp import web

    upstream = f"http://127.0.0.1:{upstream_port}"

    async def handle(request: web.Request) -> web.StreamResponse:
        rule = take(request.method, request.path, request.query_string)
        if rule:
            return web.Response(
                status=ANSWERS[rule["kind"]][0], body=error_body(rule["kind"]), content_type="application/json"
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(
            request.method,
            upstream + request.path_qs,
            headers=headers,
            data=request.content if request.body_exists else None,
            allow_redirects=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        ) as answer:
            missing = answer.status == 404 and missing_object(
                request.raw_path.split("?")[0], "alt=media" in request.query_string
            )
            if missing:
                return web.Response(status=404, body=missing[1], headers={"Content-Type": missing[0]})
            response = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP_HEADERS},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_chunked(65536):
                await response.write(chunk)
            await response.write_eof()
            return response

    async def session(app: web.Application):
        app["session"] = aiohttp.ClientSession(
            auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        yield
        await app["session"].close()

    app = web.Application(client_max_size=1 << 34)
    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{tail:.*}", handle)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("serve")
    s = sub.add_parser("set")
    s.add_argument("name")
    s.add_argument("--kind", required=True, choices=sorted(ANSWERS))
    s.add_argument("--bucket")
    s.add_argument("--method")
    s.add_argument("--contains")
    s.add_argument("--times", type=int)
    sub.add_parser("list")
    c = sub.add_parser("clear")
    c.add_argument("name", nargs="?")
    args = parser.parse_args()
    if args.cmd == "serve":
        serve(int(os.environ["TPU_RL_SIM_GCS_PORT"]), int(os.environ["TPU_RL_SIM_GCS_SERVER_PORT"]))
    elif args.cmd == "set":
        rule = set_fault(args.name, args.kind, args.bucket, args.method, args.contains, args.times)
        print(json.dumps({args.name: rule}))
    elif args.cmd == "list":
        print(json.dumps(list_faults(), indent=1, sort_keys=True))
    else:
        clear_faults(args.name)


if __name__ == "__main__":
    main()
