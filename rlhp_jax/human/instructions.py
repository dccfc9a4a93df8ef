"""What the page tells a labeler about the task.

The per-task guidance is the task's ``guidance`` in ``tasks.TASKS``: for the tasks of Christiano et
al. 2017 the paper's own (appendix B, "Instructions Provided to Contractors"), quoted with its
source; for the other tasks ours.  For a behaviour no reward function describes, the user writes it
(``--instructions``).  This module holds only the text around it.

For Atari games the text around it is all of B.2's advice on judging a clip, in the paper's order:
its introduction, the game's line, "don't worry about how the agent got into the situation it is
in", "try to minimize responding 'can't tell'" and the FAQ's answer for a clip that starts after
the agent died (neither good nor bad: average play; seeing it die, or possibly a frame of it dying,
is definitely bad).  What B.1 and B.2 both say about "tie" and "can't tell", and the arrow keys, is
on every labeling page (``static/index.html``), for every task.  B's sign-up, scheduling and
"play the game yourself for 5 minutes first" are about running a labeling session, not about a
clip (a person can play a game first on the play page, ``human.play``).
"""

from __future__ import annotations

from rlhp_jax import tasks

# Appendix B's introductions (B.1 MuJoCo, B.2 Atari), as given to the paper's contractors.
_MUJOCO_INTRO = ("You will be shown two video clips of an AI controlling a virtual robot. Look at the clips and "
                 "select the one in which better things happen. Only decide on events you actually witness in the clip.")
_ATARI_INTRO = ("You will be shown two video clips of an AI playing the game. Look at the clips and select the one in "
                "which better things happen. For example, if the left clip shows the AI shooting an enemy ship while "
                "the right clip shows it being shot by an enemy ship, then better things happen in the left clip and "
                "thus the left clip is better. Only decide on actions you actually witness in the clip.")
# B.2 after the games' guide, and its FAQ: what the page says after the game's line.
_ATARI_AFTER = (
    "Don't worry about how the agent got into the situation it is in (for instance, it doesn't matter if one agent "
    "has more lives, or is now on a more advanced level); just focus on what happens in the clip itself.",
    "Try to keep \u201ccan't tell\u201d answers to a minimum: give one only when you truly are confused about what "
    "happens in a clip.",
    "If the agent is already dead when the clip starts: if the clip comes after it got killed (but does not show the "
    "dying), its performance during the clip is neither good nor bad; treat it as purely average play. If you see "
    "it die, or the clip may contain a frame of it dying, then it's definitely bad.",
)
_OWN_INTRO = "Look at the two clips and select the one in which better things happen."


def task_instructions(env: str, custom: str | None = None) -> tuple[str, str]:
    """``(title, text)`` for the page: the user's description if given, else the paper's
    guidance for its tasks, else ours."""
    task = tasks.find(env)
    name = task.name if task else env
    title = f"{name}: which clip is better?"
    if custom:
        return title, custom.strip()
    if task is None or not task.guidance:
        return title, _OWN_INTRO
    if task.guidance_source:
        intro, after = (_MUJOCO_INTRO, ()) if task.backend == "mujoco" else (_ATARI_INTRO, _ATARI_AFTER)
        blocks = (intro, f"- {task.guidance}", *after, f"(Guidance from {task.guidance_source}.)")
        return title, "\n\n".join(blocks)
    return title, f"{_OWN_INTRO}\n\n- {task.guidance}"
