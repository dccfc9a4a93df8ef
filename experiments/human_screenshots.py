"""Screenshots of the labeling page (``rlhp_jax.human``) as a labeler sees it on a laptop.

    python -m experiments.human_screenshots --out docs/human

Makes small queues of random-policy pairs (``python -m rlhp_jax.human queue``): CartPole-v1
and, if MuJoCo rendering works here, HalfCheetah; serves each with the page's real title and
instructions; opens it in headless Chromium (Debian's ``chromium``, driven by Playwright; its
own browser download is never used) with a 1366x768 viewport; and writes

  ``labeling_page.png``              a CartPole pair on screen, both clips playing
  ``labeling_page_halfcheetah.png``  the same for a HalfCheetah pair (skipped, with a note, if
                                     MuJoCo cannot render here)
  ``labeling_empty.png``             the page while no pair is available

A pair is captured once both clips have played for more than 0.5 s (frames presented / fps,
so loops count), i.e. mid-playback, never a blank or first frame.  The screenshots show the
viewport only: what fits on a laptop screen without scrolling.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

from rlhp_jax.refusal import refuse

VIEWPORT = {"width": 1366, "height": 768}
PLAYED_S = 0.5  # both clips must have played this long before a pair is captured


def serve(store, env: str, poll_s: float = 1.0):
    from rlhp_jax.human.instructions import task_instructions
    from rlhp_jax.human.server import ServerThread, create_app

    title, text = task_instructions(env)
    return ServerThread(create_app(store, title=title, instructions=text, poll_s=poll_s), "127.0.0.1", 0).start()


def capture_pair(context, url: str, fps: float, path: pathlib.Path, timeout_ms: int = 30_000) -> None:
    page = context.new_page()
    try:
        page.goto(url)
        page.wait_for_function("document.body.dataset.state === 'pair'", timeout=timeout_ms)
        frames = int(PLAYED_S * fps) + 1  # presented frames count across loops, unlike currentTime
        page.wait_for_function(
            "n => ['left', 'right'].every((id) => { const v = document.getElementById(id);"
            "  return v.readyState >= 2 && !v.paused && v.getVideoPlaybackQuality().totalVideoFrames > n; })",
            arg=frames, timeout=timeout_ms)
        page.screenshot(path=str(path))
    finally:
        page.close()


def capture_empty(context, url: str, path: pathlib.Path, timeout_ms: int = 30_000) -> None:
    page = context.new_page()
    try:
        page.goto(url)
        page.wait_for_function("document.body.dataset.state === 'empty'", timeout=timeout_ms)
        page.wait_for_timeout(300)  # the spinner mid-turn, the counts filled in
        page.screenshot(path=str(path))
    finally:
        page.close()


def queue_for(env: str, pairs: int, work: pathlib.Path, seed: int):
    """``(store, fps)`` of a fresh queue of ``pairs`` random-policy pairs of ``env``."""
    from rlhp_jax.render.video import probe_mp4
    from rlhp_jax.human.__main__ import make_queue
    from rlhp_jax.human.store import LabelStore

    out = work / env
    make_queue(env, pairs, out, seed)
    store = LabelStore(out, path=out / "queue.sqlite")
    first = store.query(store.open_queries()[0])
    return store, probe_mp4(store.resolve(first["left_clip"]))["fps"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="docs/human", help="folder for the PNGs")
    parser.add_argument("--pairs", type=int, default=3, help="pairs per queue")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-mujoco", action="store_true", help="CartPole only")
    args = parser.parse_args(argv)

    from rlhp_jax.human.browser import CHROMIUM, launch

    if CHROMIUM is None:
        return refuse("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    from rlhp_jax.human.store import LabelStore

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="human-screens-") as tmp:
        work = pathlib.Path(tmp)
        queues = {"CartPole-v1": queue_for("CartPole-v1", args.pairs, work, args.seed)}
        if not args.no_mujoco:
            try:
                queues["HalfCheetah"] = queue_for("HalfCheetah", args.pairs, work, args.seed)
            except Exception as e:  # noqa: BLE001 — no MuJoCo rendering here: CartPole only
                print(f"HalfCheetah skipped (MuJoCo clips could not be made here: {type(e).__name__}: {e})",
                      file=sys.stderr)
        empty = LabelStore(work / "empty")
        with sync_playwright() as pw:
            context = launch(pw, work / "profile", viewport=VIEWPORT)
            try:
                for env, (store, fps) in queues.items():
                    name = "labeling_page.png" if env == "CartPole-v1" else f"labeling_page_{env.lower()}.png"
                    server = serve(store, env)
                    try:
                        capture_pair(context, server.url, fps, out / name)
                    finally:
                        server.stop()
                    print(f"wrote {out / name}")
                server = serve(empty, "CartPole-v1")
                try:
                    capture_empty(context, server.url, out / "labeling_empty.png")
                finally:
                    server.stop()
                print(f"wrote {out / 'labeling_empty.png'}")
            finally:
                context.close()
        for store, _ in queues.values():
            store.close()
        empty.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
