"""What the page tells a labeler about the task.

The per-task guidance is the task's ``guidance`` in ``tasks.TASKS``: for the tasks of Christiano et
al. 2017 the paper's own (appendix B, "Instructions Provided to Contractors"), quoted with its
source; for the other tasks ours.  For a behaviour no reward function describes, the user writes it
(``--instructions``).  This module holds only the text around it.
"""

from __future__ import annotations

from rlhp_jax import tasks

# Appendix B's introductions (B.1 MuJoCo, B.2 Atari), as given to the paper's contractors.
_MUJOCO_INTRO = ("You will be shown two video clips of an AI controlling a virtual robot. Look at the clips and "
                 "select the one in which better things happen. Only decide on events you actually witness in the clip.")
_ATARI_INTRO = ("You will be shown two video clips of an AI playing the game. Look at the clips and select the one in "
                "which better things happen. Only decide on actions you actually witness in the clip. Don't worry about "
                "how the agent got into the situation it is in; just focus on what happens in the clip itself.")
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
        intro = _MUJOCO_INTRO if task.backend == "mujoco" else _ATARI_INTRO
        return title, f"{intro}\n\n- {task.guidance}\n\n(Guidance from {task.guidance_source}.)"
    return title, f"{_OWN_INTRO}\n\n- {task.guidance}"
