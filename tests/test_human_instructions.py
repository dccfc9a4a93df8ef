"""The labeling page's instructions say what Christiano et al. 2017's appendix B told people
(``human.instructions``): for Atari games, B.2's intro, the game's line, "don't worry about how the
agent got into the situation", "minimize can't tell" and the FAQ's answer for a clip that starts
with the agent already dead; the page itself explains "tie" and "can't tell" for every task."""

import html
import re

import pytest
from fastapi.testclient import TestClient

from rlhp_jax import tasks
from rlhp_jax.human.instructions import task_instructions
from rlhp_jax.human.server import create_app
from rlhp_jax.human.store import LabelStore

LOCAL = "http://127.0.0.1"  # the page answers only this machine's host names without a token


def page_text(tmp_path, env: str) -> str:
    """The labeling page for ``env`` as a person reads it: tags dropped, entities decoded, one space."""
    _, text = task_instructions(env)
    page = TestClient(create_app(LabelStore(tmp_path), instructions=text), base_url=LOCAL).get("/")
    assert page.status_code == 200
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.text)).split())


PAPER_ATARI = [name for name, t in tasks.TASKS.items() if t.backend == "atari" and t.guidance_source]


@pytest.mark.parametrize("game", ["Pong", "Qbert"])
def test_atari_page_has_every_point_of_appendix_b2(tmp_path, game):
    text = page_text(tmp_path, game)
    # the game's own line and the intro
    assert tasks.TASKS[game].guidance.rstrip(".") in text
    assert "select the one in which better things happen" in text
    # the agent already dead at the start of a clip (B.2's FAQ)
    assert "If the agent is already dead when the clip starts" in text
    assert "neither good nor bad" in text and "purely average play" in text
    assert "If you see it die, or the clip may contain a frame of it dying, then it's definitely bad" in text
    # minimize "can't tell" (B.2), and what tie / can't tell mean (the page, every task)
    assert "\u201ccan't tell\u201d answers to a minimum" in text and "truly are confused" in text
    assert "answer tie" in text and "answer can't tell" in text
    # how the agent got there does not count (lives, level)
    assert "Don't worry about how the agent got into the situation it is in" in text
    assert "more lives" in text and "more advanced level" in text
    # in the paper's order: the game's line, don't worry, minimize can't tell, the FAQ
    order = [text.index(s) for s in (tasks.TASKS[game].guidance.rstrip("."), "Don't worry", "to a minimum",
                                     "already dead when the clip starts")]
    assert order == sorted(order)


def test_every_paper_atari_game_gets_the_atari_points_and_mujoco_does_not():
    assert len(PAPER_ATARI) == 7  # Christiano's seven games
    for game in PAPER_ATARI:
        _, text = task_instructions(game)
        assert "already dead when the clip starts" in text and "to a minimum" in text, game
    _, hopper = task_instructions("Hopper")  # B.1 has neither point
    assert "dead" not in hopper and "minimum" not in hopper
    _, custom = task_instructions("Pong", "Keep the paddle still.")  # the user's own text stands alone
    assert custom == "Keep the paddle still."
