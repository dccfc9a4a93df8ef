"""What the page tells a labeler about the task.

For the tasks of Christiano et al. 2017 the guidance is the paper's own (appendix B, "Instructions
Provided to Contractors"), quoted with its source; for the other tasks it is ours; for a
behaviour no reward function describes, the user writes it (``--instructions``).
"""

from __future__ import annotations

PAPER = "Christiano et al. 2017, appendix B"

_MUJOCO_INTRO = ("You will be shown two video clips of an AI controlling a virtual robot. Look at the clips and "
                 "select the one in which better things happen. Only decide on events you actually witness in the clip.")
_ATARI_INTRO = ("You will be shown two video clips of an AI playing the game. Look at the clips and select the one in "
                "which better things happen. Only decide on actions you actually witness in the clip. Don't worry about "
                "how the agent got into the situation it is in; just focus on what happens in the clip itself.")

# Appendix B's per-task guidance (B.1 MuJoCo, B.2 Atari), as given to the paper's contractors.
PAPER_GUIDANCE = {
    "Hopper": "The \u201ccenter\u201d of the robot is the joint closest to the pointy end. The first priority is for the "
              "center of the robot to move to the right (moving to the left is worse than not moving at all). If the "
              "two robots are roughly tied on this metric, then the tiebreaker is how high the center is.",
    "Walker2d": "The \u201ccenter\u201d of the robot is the joint where the three limbs meet. The first priority is for "
                "the center of the robot to move to the right. If the two robots are roughly tied on this metric, then "
                "the tiebreaker is how high the center is.",
    "Swimmer": "The \u201ccenter\u201d of the robot is the mark in the middle of its body. The center should move to the "
               "right as fast as possible.",
    "HalfCheetah": "The robot should move to the right as fast as possible.",
    "Ant": "The first priority is for the robot to be standing upright, and failing that for the center of the robot to "
           "be as high up as possible. If both robots are upright or neither is, the tie breaker is whichever one is "
           "moving faster to the right.",
    "Reacher": "The green dot on the robot arm should be as close as possible to the red dot. Being near for a while "
               "and far for a while is worse than being at an intermediate distance for the entire clip.",
    "InvertedPendulum": "The pendulum should be pointing approximately up. There will be a lot of ties where the "
                        "pendulum has fallen and a lot of \u201ccan't tells\u201d where it is off the side of the screen. "
                        "If you can see one pendulum and it hasn't fallen down, that's better than being unable to see "
                        "the other pendulum.",
    "InvertedDoublePendulum": "Both pendulums should be pointing approximately up (if they fall down, the cart should "
                              "try to swing them back up) and the cart should be near the center of the track. Being "
                              "high for a while and low for a while is worse than being at an intermediate distance "
                              "the entire time.",
    "BeamRider": "Shoot enemy ships (good), and don't get shot (very bad).",
    "Breakout": "Hit the ball with the paddle, break the colored blocks, and don't let the ball fall off the bottom of "
                "the screen.",
    "Enduro": "Pass as many cars as you can, and don't get passed by cars.",
    "Pong": "Knock the ball past the opponent's orange paddle on the left (good), and don't let it go past your green "
            "paddle on the right (bad).",
    "Qbert": "Change the color of as many blocks as you can (good), but don't jump off the side or run into enemies "
             "(very bad).",
    "SpaceInvaders": "Shoot enemy ships (good), and don't let your ship (the one at the bottom of the screen) get shot "
                     "(very bad).",
    "Seaquest": "Shoot the fish and enemy submarines (good) and pick up the scuba divers. Don't let your submarine run "
                "out of air or get hit by a fish or torpedo (very bad).",
}

# Ours, for the small tasks the paper did not run.
OWN_GUIDANCE = {
    "CartPole-v1": "The pole should stay upright and the cart should stay near the middle of the track. A pole that "
                   "falls (the clip jumps back to an upright pole at the centre) is very bad.",
    "Pendulum-v1": "The pendulum should swing up and stay pointing straight up, with as little spinning as possible.",
    "Acrobot-v1": "The free end of the two-link arm should swing up above the line as soon as possible.",
    "MountainCarContinuous-v0": "The car should build up speed by swinging back and forth and reach the flag on the "
                                "right hill.",
    "Asterix-MinAtar": "Collect the treasure (good) and avoid the enemies (very bad).",
    "Breakout-MinAtar": "Hit the ball with the paddle and break bricks; don't let the ball fall past the paddle.",
    "Freeway-MinAtar": "The chicken should cross the road to the top as often as possible without being hit by cars.",
    "Seaquest-MinAtar": "Shoot enemies, rescue divers and surface for air before it runs out; don't get hit.",
    "SpaceInvaders-MinAtar": "Shoot the aliens and don't get shot.",
}


def task_instructions(env: str, custom: str | None = None) -> tuple[str, str]:
    """``(title, text)`` for the page: the user's description if given, else the paper's
    guidance for its tasks, else ours."""
    from rlhp_jax.envpool_envs import canonical_task

    canon = canonical_task(env)
    name = canon[1] if canon else env
    if custom:
        return f"{name}: which clip is better?", custom.strip()
    if name in PAPER_GUIDANCE:
        intro = _MUJOCO_INTRO if canon and canon[0] == "mujoco" else _ATARI_INTRO
        return f"{name}: which clip is better?", f"{intro}\n\n- {PAPER_GUIDANCE[name]}\n\n(Guidance from {PAPER}.)"
    if env in OWN_GUIDANCE:
        return f"{env}: which clip is better?", ("Look at the two clips and select the one in which better things "
                                                 f"happen.\n\n- {OWN_GUIDANCE[env]}")
    return f"{env}: which clip is better?", "Look at the two clips and select the one in which better things happen."
