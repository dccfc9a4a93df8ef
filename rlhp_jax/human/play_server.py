"""The play page's HTTP side (layer 5): routes, a play-only app and ``python -m rlhp_jax.human play``.

The game itself (key maps, the session and its game thread) is :mod:`rlhp_jax.human.play`.

Routes (:func:`add_play_routes`, on the labeling app of ``server.create_app`` or on the
play-only app of :func:`create_play_app`; the same token guard and body cap protect them)
  ``GET  /play``                     the page
  ``GET  /api/play/status``          the session: counts, score, paused/finished, the action set
  ``GET  /api/play/frame?after=SEQ&wait=S``  the newest frame (waits up to S s for one newer
                                     than SEQ): ``width``, ``height``, ``channels`` (1: gray,
                                     3: RGB), ``data`` (base64 of the raw bytes, row-major),
                                     plus the status fields
  ``POST /api/play/keys``            ``{"keys": ["left", "fire", ...]}`` the keys held now, oldest
                                     press first (``up down left right fire``); keys start a
                                     paused game
  ``POST /api/play/pause``           ``{"paused": true|false, "reason": "user"|"focus"}``
  ``POST /api/play/episode``         end the current episode now (the game restarts, paused)
  ``POST /api/play/save``            end the current episode and write the demo file
                                     → ``{"path", "steps", "episodes", "returns"}``
Bad input is a 4xx with an ``error`` message (malformed JSON 400, wrong fields 422, nothing to
save or a finished session 409, an unknown route 404: every error has this one shape, as on the
labeling page) and changes nothing; without a token only this machine's host names are answered.
No path from a request reaches the file system: the output file is fixed when the session is made.
"""

# no ``from __future__ import annotations``: FastAPI reads the routes' annotations (local models)
import html
import json
from pathlib import Path
from typing import Literal

from rlhp_jax import tasks
from rlhp_jax.demos import new_demo_path
from rlhp_jax.human.play import MAX_KEYS, PlayError, PlaySession

_STATIC = Path(__file__).with_name("static")


def _fastapi_app(app):
    """The FastAPI app inside ``server.create_app``'s guard (or ``app`` itself)."""
    from fastapi import FastAPI

    inner = app
    while not isinstance(inner, FastAPI):
        inner = getattr(inner, "app", None)
        if inner is None:
            raise TypeError(f"not a FastAPI app or one wrapped by server.create_app: {app!r}")
    return inner


def add_play_routes(app, session: PlaySession, title: str | None = None):
    """Register the play page and API (module docstring) on ``app``: the app ``server.create_app``
    returns (its token guard and body cap then cover them too) or a bare FastAPI app."""
    from fastapi import Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import HTMLResponse, JSONResponse
    from pydantic import BaseModel, ConfigDict, Field

    api = _fastapi_app(app)

    class Keys(BaseModel):
        model_config = ConfigDict(extra="forbid")
        keys: list[str] = Field(max_length=MAX_KEYS)

    class Pause(BaseModel):
        model_config = ConfigDict(extra="forbid")
        paused: bool
        reason: Literal["user", "focus"] = "user"

    from fastapi.exception_handlers import request_validation_exception_handler as fastapi_default

    if api.exception_handlers.get(RequestValidationError, fastapi_default) is fastapi_default:
        from rlhp_jax.human.server import json_errors

        json_errors(api)  # a bare FastAPI app: errors in the shape of create_app's app (which installs the same)

    @api.exception_handler(PlayError)
    async def play_error(request: Request, exc: PlayError):
        return JSONResponse({"error": str(exc)}, exc.status)

    title = title or f"Play {session.env_name}: record demonstrations"
    settings = dict(env=session.env_name, fps=session.fps, actions=list(session.actions),
                    hint=getattr(tasks.find(session.env_name), "play_hint", ""),
                    episodes_wanted=session.episodes_wanted, out=None if session.out is None else str(session.out))
    page = (_STATIC / "play.html").read_text(encoding="utf-8")
    page = (page.replace("{{TITLE}}", html.escape(title))
                .replace("{{SETTINGS}}", json.dumps(settings).replace("<", "\\u003c")))

    @api.get("/play", response_class=HTMLResponse)
    def play_page():
        session.touch()
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    @api.get("/api/play/status")
    def play_status():
        return session.status()

    @api.get("/api/play/frame")
    def play_frame(after: int | None = Query(None, ge=-1), wait: float = Query(0.0, ge=0.0, le=2.0)):
        return JSONResponse(session.frame(after, wait), headers={"Cache-Control": "no-store"})

    @api.post("/api/play/keys")
    def play_keys(body: Keys):
        return session.set_keys(body.keys)

    @api.post("/api/play/pause")
    def play_pause(body: Pause):
        return session.set_paused(body.paused, body.reason)

    @api.post("/api/play/episode")
    def play_episode():
        return session.end_episode()

    @api.post("/api/play/save")
    def play_save():
        return dict(session.save(), status=session.status())

    return app


def create_play_app(session: PlaySession, *, token: str | None = None, max_body: int | None = None):
    """A play-only app (no label store) behind the labeling server's token guard and body cap;
    ``/`` leads to ``/play``."""
    from fastapi import FastAPI
    from fastapi.responses import RedirectResponse

    from rlhp_jax.human.server import MAX_BODY, Guard, json_errors

    app = FastAPI(title="rlhp_jax play", docs_url=None, redoc_url=None, openapi_url=None)
    json_errors(app)

    @app.get("/")
    def root():
        return RedirectResponse("/play", 303)

    add_play_routes(app, session)
    return Guard(app, token, MAX_BODY if max_body is None else max_body)


def play_url(server) -> str:
    """The page's URL on a ``ServerThread`` (with the token when there is one)."""
    host = f"[{server.host}]" if ":" in server.host else server.host
    return f"http://{host}:{server.port}/play" + (f"?token={server.token}" if server.token else "")


# ---------------------------------------------------------------------------- the CLI
def serve_play(args) -> int:
    """``python -m rlhp_jax.human play``: serve the page, record until the person saves (or the
    episode count is reached, or Ctrl-C, which saves what was recorded), print a summary."""
    from rlhp_jax.human.server import ServerThread, check_binding, resolve_token

    check_binding(args.host, args.token)
    out = new_demo_path(args.out, args.overwrite)
    token = resolve_token(args.token)
    session = PlaySession(args.env, out, episodes=args.episodes, full_action_space=args.full_action_space,
                          fps=args.fps, seed=args.seed, overwrite=args.overwrite)
    server = ServerThread(create_play_app(session, token=token), args.host, args.port, token).start()
    session.start()
    print(f"play page: {play_url(server)}  (demos go to {out})", flush=True)
    print(f"{session.env_name} at {session.fps:g} steps/s; actions: {' '.join(session.actions)}. Keys: arrows move, "
          "Space fires; the game waits for a key. Save in the page (or Ctrl-C here: what was recorded is saved).",
          flush=True)
    try:
        while not session.wait_finished(0.5):
            pass
    except KeyboardInterrupt:
        print("interrupted: saving what was recorded", flush=True)
    finally:
        session.close()
        try:
            session.save_if_unsaved()
        finally:
            server.stop()
    status = session.status()
    if status["error"]:
        print(f"error: {status['error']}", flush=True)
    print(session.summary(), flush=True)
    return 1 if status["error"] else 0
