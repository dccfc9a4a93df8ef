"""The labeling web app (layer 5: a teacher): two clips side by side, four answers, one store.

``create_app(store, ...)`` builds a FastAPI app over a :class:`~rlhp_jax.human.store.LabelStore`;
``ServerThread`` runs it with uvicorn in a background thread (inside the trainer, or alone for
``python -m rlhp_jax.human serve``).

API (JSON; every route needs the access token when one is set)
  ``GET  /``                      the page (also ``HEAD``)
  ``GET  /api/next?labeler=NAME`` lease the next pair → ``{"pair": {...} | null, "status": {...}}``
  ``POST /api/label``             ``{"pair": ID, "lease": TOKEN, "choice": "left|right|tie|cant_tell"}``
  ``POST /api/release``           ``{"lease": TOKEN}`` give a pair back (skip)
  ``GET  /api/status?labeler=``   counts and what the trainer published (labels due, steps, …)
  ``GET  /api/clip/{pair}/{side}`` the MP4 of a pair's left or right clip (byte ranges supported;
                                  also ``HEAD``)
A labeler's name is checked by :func:`~rlhp_jax.human.store.check_labeler`; the page gets that
rule's character class in its settings and applies the same check before it sends a name.

Safety: binds to 127.0.0.1 unless told otherwise, and refuses a non-loopback address without
an access token of at least ``MIN_PUBLIC_TOKEN`` characters (:func:`check_binding`, the one home
of these rules; ``--token auto`` makes one).  The token is accepted as ``Authorization: Bearer``,
as ``?token=`` (the URL the server prints; the page then keeps it in an HttpOnly cookie so its
videos load) or as that cookie.  Without a token only requests addressed to this machine's own
names (``Host``: localhost, 127.x.y.z or [::1], any port) are answered, so a web site whose DNS
name is re-pointed at 127.0.0.1 (DNS rebinding) gets a 403, not the API; and a request another
site's page makes the browser send (``Sec-Fetch-Site`` or ``Origin`` naming another site, a
navigation to the page aside) gets a 403 too, so no page the labeler visits can lease pairs.  These checks and the
body cap live in one ASGI middleware (``Guard``) that the play page shares.

Errors: every error is ``{"error": message}`` with a 4xx status, whatever raised it (this app or
FastAPI itself), and none writes anything: a wrong host name 403, a missing token 401, a body
over ``MAX_BODY`` bytes 413 (refused before it is read), a body that is not JSON (not UTF-8,
malformed, nested too deep) 400, a well-formed request with wrong fields 422, a bad labeler name
400, an unknown route or pair 404, a method a route lacks 405, a withdrawn pair 410, a lease that
does not belong to the pair 409.  Clips are addressed by pair id and side only: no path from a
request ever reaches the file system, and stored paths are re-checked to stay inside the run
directory.
"""


import argparse
import hmac
import html
import http.client
import ipaddress
import json
import re
import secrets
import socket
import string
import threading
import time
from pathlib import Path
from typing import Any, Literal

from rlhp_jax.human.store import (DEFAULT_LEASE_S, MAX_LEASE_S, LabelStore, StoreError, UnknownQuery, check_labeler,
                                  check_lease_s, labeler_chars)

MAX_BODY = 8 * 1024  # an answer is ~150 bytes
TOKEN_COOKIE = "rlhp_token"
MIN_PUBLIC_TOKEN = 16  # characters of a token that guards a page other machines can reach
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-._~")  # safe in a URL, a header and a cookie
_HOST_HEADER = re.compile(r"(\[[^\]]*\]|[^:\[\]]*)(?::[0-9]{1,5})?")  # name or [IPv6], then an optional port
_STATIC = Path(__file__).with_name("static")


def is_loopback(host: str) -> bool:
    """``host`` (an address or ``localhost``, no port, no brackets) names this machine."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_local_host_header(value: str) -> bool:
    """A ``Host`` header naming this machine: localhost, 127.x.y.z or [::1], with or without a port."""
    m = _HOST_HEADER.fullmatch(value)
    return m is not None and is_loopback(m.group(1).removeprefix("[").removesuffix("]"))


def check_binding(host: str, token: str | None) -> None:
    """The rules for serving a page (labeling or play), checked before anything is created.

    A token, when given, is letters, digits and - . _ ~ only (it travels in the printed URL, a
    header and a cookie, which would mangle anything else).  Beyond this machine a token is
    required, of at least ``MIN_PUBLIC_TOKEN`` characters; ``auto`` generates a strong one."""
    if token and token != "auto" and not set(token) <= _TOKEN_CHARS:
        raise ValueError("The access token may hold only letters, digits and - . _ ~ (it travels in the page's URL "
                         "and a cookie): choose another, or --token auto to generate one.")
    if is_loopback(host):
        return
    if not token:
        raise ValueError(f"Serving on {host} makes the page reachable from other machines: give an access token "
                         "(--token SECRET, or --token auto to generate one), or bind to 127.0.0.1.")
    if token != "auto" and len(token) < MIN_PUBLIC_TOKEN:
        raise ValueError(f"Serving on {host} makes the page reachable from other machines: its access token must be "
                         f"at least {MIN_PUBLIC_TOKEN} characters (this one has {len(token)}); --token auto generates "
                         "one.")


def error_response(status: int, message: str, headers: dict[str, str] | None = None):
    """The one shape of every error this package's pages answer: ``{"error": message}``."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status, headers=headers)


class Guard:
    """ASGI middleware in front of every page this package serves (labeling and play): what a
    request must pass before any route sees it (module docstring, "Safety").  Without a token,
    the ``Host`` header must name this machine (403); with one, the token (401).  Bodies over
    ``max_body`` bytes are refused (413) before they are read, or as soon as the cap is passed
    (chunked uploads have no Content-Length to check).  An error a route answers in another shape
    than JSON (Starlette's FileResponse answers a Range it cannot serve in plain text) leaves as
    ``{"error": ...}`` (:func:`_json_errors_only`)."""

    def __init__(self, app, token: str | None, max_body: int):
        self.app, self.token, self.max_body = app, token, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.requests import Request

        request = Request(scope)
        refusal = self._refusal(request)
        if refusal is not None:
            return await error_response(*refusal)(scope, receive, send)
        set_cookie = bool(self.token) and "token" in request.query_params

        body, more = b"", scope["method"] in ("POST", "PUT", "PATCH")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await error_response(413, f"request body over {self.max_body} bytes")(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def send_with_cookie(message):
            if set_cookie and message["type"] == "http.response.start":
                cookie = f"{TOKEN_COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                message = dict(message, headers=list(message.get("headers", [])) + [(b"set-cookie", cookie.encode())])
            await send(message)

        await self.app(scope, replay, _json_errors_only(send_with_cookie))

    def _refusal(self, request) -> tuple[int, str] | None:
        """(status, message) of a request refused before any route sees it, or None."""
        if not self.token:
            host = request.headers.get("host", "")
            if not is_local_host_header(host):
                return 403, (f"refused: host name {host!r} is not this machine's (localhost, 127.0.0.1 or [::1]); "
                             "open the URL the server printed, or serve with an access token (--token) to be "
                             "reached by other names")
            if _from_another_site(request):
                return 403, ("refused: a request made by another web site's page (only this page, or a link "
                             "followed to it, is answered without an access token)")
        else:
            given = _bearer(request.headers.get("authorization", "")) or request.cookies.get(TOKEN_COOKIE)
            given = request.query_params.get("token", given)
            if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
                return 401, "missing or wrong access token: open the URL the server printed (it ends in ?token=...)"
        length = request.headers.get("content-length")
        if length is not None and not (length.isascii() and length.isdigit()):
            return 400, f"Content-Length {length!r} is not a number of bytes"
        if length is not None and int(length) > self.max_body:
            return 413, f"request body over {self.max_body} bytes"
        return None


def _from_another_site(request) -> bool:
    """A request another web site's page made the browser send (an ``<img>``, a ``fetch``, a form,
    an iframe or a window it opened): its ``Sec-Fetch-Site`` (every current browser) or its
    ``Origin`` names another site, or another port of this machine.  Without a token that is all
    that keeps a page the labeler happens to visit from leasing pairs under made-up names or pressing
    the play page's keys.  Following a link to a page (a navigation to a path outside ``/api/``) is
    not refused: the pages are static, and each acts only through the API, which a navigation from
    elsewhere never reaches (``/api/next`` leases a pair on a plain GET)."""
    site = request.headers.get("sec-fetch-site", "")
    if site in ("cross-site", "same-site"):
        page = request.method in ("GET", "HEAD") and not request.url.path.startswith("/api/")
        if not (page and request.headers.get("sec-fetch-mode", "") == "navigate"):
            return True
    origin = request.headers.get("origin")
    if origin is None:
        return False
    m = re.fullmatch(r"https?://(.+)", origin)
    # "null" (a sandboxed or file: page) included; another local port is another site's page too
    return m is None or m.group(1).lower() != request.headers.get("host", "").lower()


def _json_errors_only(send):
    """``send`` for an app whose error answers (status >= 400) that are not JSON are rewritten as
    ``{"error": their text, or the status's name}``, other headers kept (e.g. Content-Range)."""
    held, chunks = None, []

    async def shaped(message):
        nonlocal held
        if message["type"] == "http.response.start" and message["status"] >= 400:
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            if not ctype.startswith(b"application/json"):
                held = message
                return
        if held is None or message["type"] != "http.response.body":
            return await send(message)
        chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        text = b"".join(chunks).decode("utf-8", "replace").strip() or http.client.responses.get(held["status"], "")
        body = json.dumps({"error": text or f"HTTP {held['status']}"}).encode()
        headers = [(k, v) for k, v in held.get("headers", []) if k.lower() not in (b"content-type", b"content-length")]
        await send(dict(held, headers=headers + [(b"content-type", b"application/json"),
                                                 (b"content-length", str(len(body)).encode())]))
        await send({"type": "http.response.body", "body": body, "more_body": False})

    return shaped


def validation_error_response(exc):
    """Malformed JSON -> 400; wrong fields or values -> 422 naming each (every page's API)."""
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "malformed JSON")
    detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                       for e in errors)
    return error_response(422, f"invalid request: {detail}")


def json_errors(api) -> None:
    """Make every error the FastAPI app ``api`` answers ``{"error": message}``: its routes'
    HTTPExceptions; FastAPI's own (an unknown route 404, a method the route lacks 405, a body it
    cannot parse, such as invalid UTF-8 or JSON nested too deep, 400); invalid requests
    (:func:`validation_error_response`); and, were a route to fail, the 500 (the error is still
    raised to the server's log)."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    async def http_error(request, exc: HTTPException):
        return error_response(exc.status_code, str(exc.detail), exc.headers)

    async def invalid(request, exc: RequestValidationError):
        return validation_error_response(exc)

    async def failed(request, exc: Exception):
        return error_response(500, "internal error: see the server's log")

    api.add_exception_handler(HTTPException, http_error)
    api.add_exception_handler(RequestValidationError, invalid)
    api.add_exception_handler(Exception, failed)


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def create_app(store: LabelStore, *, token: str | None = None, title: str = "Which clip is better?",
               instructions: str = "", lease_s: float = DEFAULT_LEASE_S, max_body: int = MAX_BODY,
               poll_s: float = 3.0):
    """The FastAPI app over ``store``, behind the guard (module docstring).  ``instructions`` is
    plain text (paragraphs separated by blank lines; lines starting with "- " become a list),
    shown above the clips.  ``lease_s``: see :func:`~rlhp_jax.human.store.check_lease_s`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import FileResponse, HTMLResponse
    from pydantic import BaseModel, ConfigDict, Field

    lease_s = check_lease_s(lease_s)
    app = FastAPI(title="rlhp_jax labeling", docs_url=None, redoc_url=None, openapi_url=None)
    json_errors(app)

    class Answer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pair: str = Field(min_length=1, max_length=64)
        lease: str = Field(min_length=1, max_length=64)
        choice: Literal["left", "right", "tie", "cant_tell"]

    class Release(BaseModel):
        model_config = ConfigDict(extra="forbid")
        lease: str = Field(min_length=1, max_length=64)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError):
        return error_response(exc.status, str(exc))

    page = (_STATIC / "index.html").read_text(encoding="utf-8")
    settings = json.dumps(dict(title=title, poll_ms=int(poll_s * 1000), lease_s=lease_s,
                               name_chars=labeler_chars())).replace("<", "\\u003c")
    page = (page.replace("{{TITLE}}", html.escape(title))
                .replace("{{INSTRUCTIONS}}", render_instructions(instructions))
                .replace("{{SETTINGS}}", settings))

    def status(labeler: str | None = None) -> dict[str, Any]:
        return dict(store.counts(labeler), trainer=store.meta())

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    def index():
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @app.get("/api/next")
    def next_pair(labeler: str = "labeler"):
        offer = store.lease(check_labeler(labeler), lease_s)
        pair = None
        if offer is not None:
            pair = dict(id=offer.query_id, lease=offer.token, left=f"/api/clip/{offer.query_id}/left",
                        right=f"/api/clip/{offer.query_id}/right", expires_in=round(offer.expires - store.clock(), 1))
        return dict(pair=pair, status=status(labeler))

    @app.post("/api/label")
    def label(answer: Answer):
        result = store.submit(answer.pair, answer.lease, answer.choice)
        return dict(recorded=result.recorded, reason=result.reason,
                    choice=result.label.choice if result.label else None, status=status(
                        result.label.labeler if result.label else None))

    @app.post("/api/release")
    def release(body: Release):
        store.release(body.lease)
        return dict(released=True)

    @app.get("/api/status")
    def get_status(labeler: str | None = None):
        return status(check_labeler(labeler) if labeler is not None else None)

    @app.api_route("/api/clip/{pair}/{side}", methods=["GET", "HEAD"])
    def clip(pair: str, side: Literal["left", "right"]):
        q = store.query(pair)
        path = store.resolve(q[f"{side}_clip"])
        if not path.is_file():
            raise UnknownQuery("clip not found")
        return FileResponse(path, media_type="video/mp4", headers={"Cache-Control": "private, max-age=3600"})

    return Guard(app, token, max_body)


def render_instructions(text: str) -> str:
    """Plain text -> escaped HTML paragraphs and lists (no markup from the user reaches the page)."""
    blocks = []
    for block in [b.strip() for b in text.strip().split("\n\n") if b.strip()]:
        lines = block.splitlines()
        if all(line.lstrip().startswith("- ") for line in lines):
            items = "".join(f"<li>{html.escape(line.lstrip()[2:].strip())}</li>" for line in lines)
            blocks.append(f"<ul>{items}</ul>")
        else:
            blocks.append(f"<p>{html.escape(' '.join(line.strip() for line in lines))}</p>")
    return "\n".join(blocks)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_token(token: str | None) -> str | None:
    """``"auto"`` -> a fresh random token; anything else as given."""
    return secrets.token_urlsafe(18) if token == "auto" else token


def add_server_flags(p) -> None:
    """The flags of how the page is served (``rlhp_jax.human`` and the experiment entry points)."""
    p.add_argument("--host", default="127.0.0.1", help="address of the labeling page (default 127.0.0.1: this "
                                                      "machine only)")
    p.add_argument("--port", type=int, default=8000, help="port of the labeling page (0: any free port)")
    p.add_argument("--token", default=None,
                   help="access token every request must carry ('auto' generates one): letters, digits and - . _ ~; "
                        f"required beyond localhost, of at least {MIN_PUBLIC_TOKEN} characters there")
    p.add_argument("--instructions", default=None,
                   help="what labelers should prefer, in your words (default: the paper's text for its tasks)")
    p.add_argument("--lease", type=lease_seconds, default=DEFAULT_LEASE_S,
                   help=f"seconds a pair stays with one labeler before it is offered again: more than 0, at most "
                        f"{MAX_LEASE_S:g} (a day); default {DEFAULT_LEASE_S:g}")


def lease_seconds(text: str) -> float:
    """``--lease``: :func:`~rlhp_jax.human.store.check_lease_s` as an argparse type (a usage error,
    not a traceback or a server whose every answer fails)."""
    try:
        return check_lease_s(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def start_page(store: LabelStore, env: str | None, args) -> "ServerThread":
    """Serve the page for ``store`` as the flags of ``add_server_flags`` say; prints its URL."""
    from rlhp_jax.human.instructions import task_instructions

    token = resolve_token(args.token)
    title, text = task_instructions(env or "", args.instructions)
    app = create_app(store, token=token, title=title, instructions=text, lease_s=args.lease)
    server = ServerThread(app, args.host, args.port, token).start()
    print(f"labeling page: {server.url}  (answers go to {store.path})", flush=True)
    return server


class ServerThread:
    """uvicorn serving ``app`` from a daemon thread; ``url`` includes the token when there is one."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 8000, token: str | None = None):
        import uvicorn

        check_binding(host, token)
        self.host, self.port, self.token = host, port or free_port(host), token
        config = uvicorn.Config(app, host=host, port=self.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="label-server", daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def start(self, timeout: float = 20.0) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the labeling server did not start on {self.host}:{self.port} "
                                   "(is the port in use? choose another with --port)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
