"""Video files a person watches (layer 5: what a person sees): H.264 MP4 encoding and probing.

``encode_mp4`` writes ``[T, H, W, 3]`` RGB or ``[T, H, W]`` grayscale uint8 frames as H.264
(``libx264``, ``yuv420p``, ``+faststart``) through the ffmpeg bundled with ``imageio-ffmpeg``
(the format DESIGN.md records as playing in Chromium).  ``yuv420p`` needs even sizes: odd sizes
are padded by repeating the last row/column.  ``probe_mp4`` reads a file back (frames, duration,
size, codec).  ``upscale`` is the nearest-neighbour integer upscaling every clip uses.

Only segments that are actually shown to a person are encoded, never anything on the training
hot path, so this module is plain numpy + Python (no jit).
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlhp_jax.files import place_new, temporary_path

# imageio-ffmpeg starts its ffmpeg writer with ``preexec_fn=os.setpgrp`` (to keep a terminal's Ctrl-C
# from it): Python code in the forked child, which deadlocks when another thread held a lock at the
# fork.  Seen on 2026-11-26: a clip thread of the human teacher waited forever in
# ``Popen._execute_child`` on a child that never exec'd ffmpeg (one thread, on a futex), the trainer
# joined that thread, and the browser-taught test hung.  imageio-ffmpeg's own switch drops the
# preexec_fn; ffmpeg then shares our process group, so a terminal's Ctrl-C stops an encode in
# progress as well (its temporary file is removed, never renamed into place).
os.environ["IMAGEIO_FFMPEG_NO_PREVENT_SIGINT"] = "1"


@contextlib.contextmanager
def _exec_only_fork():
    """Silence Python's 'os.fork() with threads' warning for subprocesses that exec ffmpeg at
    once (the child runs no Python code, so JAX's threads cannot deadlock it: see
    ``IMAGEIO_FFMPEG_NO_PREVENT_SIGINT`` above)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield

def _as_frames(frames: Any) -> np.ndarray:
    """Validate a clip; returns ``[T, H, W, 3]`` (RGB) or ``[T, H, W]`` (grayscale) uint8."""
    if not isinstance(frames, np.ndarray):
        frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got dtype {frames.dtype}")
    if frames.ndim == 4 and frames.shape[-1] == 1:
        frames = frames[..., 0]
    if not (frames.ndim == 3 or (frames.ndim == 4 and frames.shape[-1] == 3)):
        raise ValueError(
            f"frames must be [T, H, W, 3] (RGB) or [T, H, W] (grayscale), got shape {frames.shape}")
    if frames.shape[0] == 0:
        raise ValueError("empty clip: frames has no time steps (T == 0)")
    if frames.shape[1] == 0 or frames.shape[2] == 0:
        raise ValueError(f"frames have zero height or width: shape {frames.shape}")
    return frames


def _scale_pair(scale: int | Sequence[int]) -> tuple[int, int]:
    pair = (scale, scale) if np.ndim(scale) == 0 else tuple(scale)
    if len(pair) != 2 or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in pair):
        raise ValueError(f"scale must be a positive integer or a pair of them, got {scale!r}")
    return int(pair[0]), int(pair[1])


def upscale(frames: np.ndarray, scale: int | Sequence[int]) -> np.ndarray:
    """Nearest-neighbour integer upscaling of ``[T, H, W(, C)]`` along H and W.

    ``scale`` is one integer or ``(scale_h, scale_w)``.
    """
    sh, sw = _scale_pair(scale)
    if sh > 1:
        frames = np.repeat(frames, sh, axis=1)
    if sw > 1:
        frames = np.repeat(frames, sw, axis=2)
    return frames


def _pad_even(frames: np.ndarray) -> np.ndarray:
    """Repeat the last row / column so H and W are even (yuv420p subsamples chroma 2×2)."""
    pad_h, pad_w = frames.shape[1] % 2, frames.shape[2] % 2
    if not (pad_h or pad_w):
        return frames
    widths = [(0, 0), (0, pad_h), (0, pad_w)] + [(0, 0)] * (frames.ndim - 3)
    return np.pad(frames, widths, mode="edge")


def encode_mp4(frames: Any, path: str | os.PathLike, fps: float,
               scale: int | Sequence[int] = 1, crf: int = 18, replace: bool = True) -> str:
    """Write a clip as a browser-playable H.264 MP4; returns the path.

    frames: ``[T, H, W, 3]`` RGB or ``[T, H, W]`` grayscale, uint8.  ``scale`` (an integer or
    ``(scale_h, scale_w)``) upscales with nearest neighbour first; odd sizes are then padded to
    even.  ``crf`` is x264's constant rate factor (lower = better; 18 keeps upscaled pixel
    edges sharp).  The file appears atomically: ffmpeg writes a temporary file in the same
    directory, which is then renamed onto ``path`` (``replace=False``: only where nothing is at
    ``path`` by then, ``FileExistsError`` otherwise, what is there kept).
    """
    import imageio_ffmpeg

    frames = _as_frames(frames)
    fps = float(fps)
    if not np.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number, got {fps}")
    frames = _pad_even(upscale(frames, scale))
    if frames.ndim == 3:  # grayscale -> RGB; x264 encodes yuv420p either way
        frames = np.repeat(frames[..., None], 3, axis=-1)
    frames = np.ascontiguousarray(frames)
    t, h, w, _ = frames.shape

    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"output directory does not exist: {directory}")
    tmp = os.fspath(temporary_path(path, ".mp4"))  # ffmpeg picks the container by the extension
    try:
        writer = imageio_ffmpeg.write_frames(
            tmp, (w, h), pix_fmt_in="rgb24", pix_fmt_out="yuv420p", fps=fps, quality=None,
            codec="libx264", macro_block_size=2, ffmpeg_log_level="error",
            output_params=["-crf", str(int(crf)), "-movflags", "+faststart"])
        with _exec_only_fork():
            writer.send(None)  # start ffmpeg
        for frame in frames:
            writer.send(frame)
        writer.close()
        if replace:
            os.replace(tmp, path)
        else:
            place_new(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def _mp4_top_level_boxes(path: str) -> list[str]:
    """Types of the top-level boxes of an MP4 file, in order ('ftyp', 'moov', 'mdat', ...)."""
    boxes = []
    size_total = os.path.getsize(path)
    with open(path, "rb") as f:
        pos = 0
        while pos + 8 <= size_total and len(boxes) < 64:
            f.seek(pos)
            header = f.read(16)
            size = int.from_bytes(header[:4], "big")
            boxes.append(header[4:8].decode("latin-1"))
            if size == 1:  # 64-bit size
                size = int.from_bytes(header[8:16], "big")
            elif size == 0:  # box runs to end of file
                break
            if size < 8:
                break
            pos += size
    return boxes


def probe_mp4(path: str | os.PathLike) -> dict[str, Any]:
    """What a video file holds, read back with the bundled ffmpeg.

    Returns ``frames`` (decoded count), ``duration_s`` (container duration, 10 ms resolution),
    ``width``, ``height``, ``codec`` (e.g. 'h264'), ``pix_fmt`` (e.g. 'yuv420p'), ``fps``
    (the stream's frame rate), and ``faststart`` (the index, ``moov``, precedes the media data,
    so a browser can start playing before the whole file has arrived).
    """
    import imageio_ffmpeg

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(path)
    with _exec_only_fork():
        out = subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", "-i", path],
                             capture_output=True, text=True, errors="replace").stderr
    stream = re.search(r"Stream #\S+.*?: Video: (\w+)[^,]*, (\w+)[^,]*?(?:\([^)]*\))?, (\d+)x(\d+)",
                       out)
    if stream is None:
        raise ValueError(f"no video stream in {path}: {out.strip()[-300:]}")
    duration = re.search(r"Duration: (\d+):(\d+):(\d+(?:\.\d+)?)", out)
    fps = re.search(r", (\d+(?:\.\d+)?(?:k)?) fps", out)
    frames, _ = imageio_ffmpeg.count_frames_and_secs(path)
    boxes = _mp4_top_level_boxes(path)
    return dict(
        frames=int(frames),
        duration_s=(int(duration[1]) * 3600 + int(duration[2]) * 60 + float(duration[3])
                    if duration else float("nan")),
        width=int(stream[3]),
        height=int(stream[4]),
        codec=stream[1],
        pix_fmt=stream[2],
        fps=(float(fps[1].rstrip("k")) * (1000 if fps[1].endswith("k") else 1)
             if fps else float("nan")),
        faststart=("moov" in boxes and "mdat" in boxes
                   and boxes.index("moov") < boxes.index("mdat")),
    )
