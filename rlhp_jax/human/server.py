"""The labeling web app (layer 5: a teacher): two clips side by side, four answers, one store.

``create_app(store, ...)`` builds a FastAPI app over a :class:`~rlhp_jax.human.store.LabelStore`;
``ServerThread`` runs it with uvicorn in a background thread (inside the trainer, or alone for
``python -m rlhp_jax.human serve``).

API (JSON; every route needs the access token when one is set)
  ``GET  /``                      the page
  ``GET  /api/next?labeler=NAME`` lease the next pair → ``{"pair": {...} | null, "status": {...}}``
  ``POST /api/label``             ``{"pair": ID, "lease": TOKEN, "choice": "left|right|tie|cant_tell"}``
  ``POST /api/release``           ``{"lease": TOKEN}`` give a pair back (skip)
  ``GET  /api/status?labeler=``   counts and what the trainer published (labels due, steps, …)
  ``GET  /api/clip/{pair}/{side}`` the MP4 of a pair's left or right clip (byte ranges supported)

Safety: binds to 127.0.0.1 unless told otherwise, and refuses a non-loopback address without
an access token.  The token is accepted as ``Authorization: Bearer``, as ``?token=`` (the URL
the server prints; the page then keeps it in an HttpOnly cookie so its videos load) or as that
cookie.  Bodies over ``MAX_BODY`` bytes are refused with 413 before they are read; malformed
JSON is a 400, a well-formed request with wrong fields a 422, an unknown pair a 404, a
withdrawn pair a 410, a lease that does not belong to the pair a 409; none of them writes
anything.  Clips are addressed by pair id and side only: no path from a request ever reaches
the file system, and stored paths are re-checked to stay inside the run directory.
"""


import hmac
import html
import ipaddress
import json
import secrets
import socket
import threading
import time
from pathlib import Path
from typing import Any, Literal

from rlhp_jax.human.store import DEFAULT_LEASE_S, LabelStore, StoreError, UnknownQuery, check_labeler

MAX_BODY = 8 * 1024  # an answer is ~150 bytes
TOKEN_COOKIE = "rlhp_token"
_STATIC = Path(__file__).with_name("static")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Refuse to serve beyond this machine without an access token."""
    if not is_loopback(host) and not token:
        raise ValueError(f"Serving on {host} makes the page reachable from other machines: give an access token "
                         "(--token SECRET, or --token auto to generate one), or bind to 127.0.0.1.")


class _Guard:
    """ASGI middleware: the access token on every request, and a hard cap on body size."""

    def __init__(self, app, token: str | None, max_body: int):
        self.app, self.token, self.max_body = app, token, max_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        request = Request(scope)
        set_cookie = False
        if self.token:
            given = _bearer(request.headers.get("authorization", "")) or request.cookies.get(TOKEN_COOKIE)
            from_query = request.query_params.get("token")
            if from_query is not None:
                given, set_cookie = from_query, True
            if not given or not hmac.compare_digest(given.encode(), self.token.encode()):
                return await JSONResponse({"error": "missing or wrong access token: open the URL the server printed "
                                                    "(it ends in ?token=...)"}, 401)(scope, receive, send)
        length = request.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            return await JSONResponse({"error": f"request body over {self.max_body} bytes"}, 413)(scope, receive, send)

        # Read the body here, up to the cap (chunked uploads have no Content-Length to check).
        body, more = b"", scope["method"] in ("POST", "PUT", "PATCH")
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.max_body:
                return await JSONResponse({"error": f"request body over {self.max_body} bytes"}, 413)(
                    scope, receive, send)
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

        await self.app(scope, replay, send_with_cookie)


def validation_error_response(exc):
    """Malformed JSON -> 400; wrong fields or values -> 422 naming each (every page's API)."""
    from fastapi.responses import JSONResponse

    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return JSONResponse({"error": "malformed JSON"}, 400)
    detail = "; ".join(f"{'.'.join(str(x) for x in e.get('loc', ())[1:]) or 'body'}: {e.get('msg')}"
                       for e in errors)
    return JSONResponse({"error": f"invalid request: {detail}"}, 422)


def _bearer(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


def create_app(store: LabelStore, *, token: str | None = None, title: str = "Which clip is better?",
               instructions: str = "", lease_s: float = DEFAULT_LEASE_S, max_body: int = MAX_BODY,
               poll_s: float = 3.0):
    """The FastAPI app over ``store``.  ``instructions`` is plain text (paragraphs separated by
    blank lines; lines starting with "- " become a list), shown above the clips."""
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, Field

    app = FastAPI(title="rlhp_jax labeling", docs_url=None, redoc_url=None, openapi_url=None)

    class Answer(BaseModel):
        model_config = ConfigDict(extra="forbid")
        pair: str = Field(min_length=1, max_length=64)
        lease: str = Field(min_length=1, max_length=64)
        choice: Literal["left", "right", "tie", "cant_tell"]

    class Release(BaseModel):
        model_config = ConfigDict(extra="forbid")
        lease: str = Field(min_length=1, max_length=64)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError):
        return validation_error_response(exc)

    @app.exception_handler(StoreError)
    async def store_error(request: Request, exc: StoreError):
        return JSONResponse({"error": str(exc)}, exc.status)

    page = (_STATIC / "index.html").read_text(encoding="utf-8")
    settings = json.dumps(dict(title=title, poll_ms=int(poll_s * 1000), lease_s=lease_s)).replace("<", "\\u003c")
    page = (page.replace("{{TITLE}}", html.escape(title))
                .replace("{{INSTRUCTIONS}}", render_instructions(instructions))
                .replace("{{SETTINGS}}", settings))

    def status(labeler: str | None = None) -> dict[str, Any]:
        return dict(store.counts(labeler), trainer=store.meta())

    @app.get("/", response_class=HTMLResponse)
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

    @app.get("/api/clip/{pair}/{side}")
    def clip(pair: str, side: Literal["left", "right"]):
        q = store.query(pair)
        path = store.resolve(q[f"{side}_clip"])
        if not path.is_file():
            raise UnknownQuery("clip not found")
        return FileResponse(path, media_type="video/mp4", headers={"Cache-Control": "private, max-age=3600"})

    return _Guard(app, token, max_body)


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
                   help="access token every request must carry ('auto' generates one); required beyond localhost")
    p.add_argument("--instructions", default=None,
                   help="what labelers should prefer, in your words (default: the paper's text for its tasks)")
    p.add_argument("--lease", type=float, default=DEFAULT_LEASE_S, help="seconds a pair stays with one labeler")


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
