"""Video bytes to sampled frames, with PyAV (FFmpeg inside).

Frames are sampled as mlx-vlm's ``load_video`` samples them (reference, "Video
input": 2 fps, at most 768 frames, at least 4, an even count, evenly spaced
over the clip), so the processor sees what ``mlx_vlm.generate`` would give it.
A container PyAV cannot open, one without a video stream or without a
decodable frame is a :class:`~.images.MediaError` (a 400 naming the part).
"""

from __future__ import annotations

import io
import math
from typing import Any

from mlxspec.engine.media.images import MediaError

__all__ = ["FPS", "MAX_FRAMES", "MAX_VIDEO_BYTES", "decode_video"]

#: Frames sampled per second of video (reference: 2 fps).
FPS = 2.0
#: Most frames sampled from one clip (reference: 768).
MAX_FRAMES = 768
#: Fewest frames sampled, and the count's multiple (Qwen-VL's temporal patches).
MIN_FRAMES, FRAME_FACTOR = 4, 2
#: Largest video body (reference: 256 MB).
MAX_VIDEO_BYTES = 256 * 1024 * 1024


def _frames(data: bytes, where: str) -> tuple[list[Any], float]:
    """Every frame as an RGB array, and the stream's frame rate."""
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            if not container.streams.video:
                raise MediaError(f"{where}: the video has no video stream", param=where)
            stream = container.streams.video[0]
            rate = float(stream.average_rate or stream.base_rate or 1.0)
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except MediaError:
        raise
    except (av.error.FFmpegError, ValueError, OSError) as e:
        raise MediaError(f"{where}: video could not be decoded ({e})", param=where) from None
    if not frames:
        raise MediaError(f"{where}: the video has no frames", param=where)
    return frames, rate


def decode_video(data: bytes, where: str = "video") -> tuple[Any, dict[str, Any]]:
    """Decode a clip and sample its frames.

    Args:
        data (bytes): the container's bytes (mp4, webm, mov, ...).
        where (str): the part named in errors. Default: ``"video"``.

    Returns:
        tuple: the frames, ``uint8`` NumPy ``(T, 3, H, W)``, and their metadata
        (``total_num_frames``, ``fps``, ``frames_indices``, ``width``,
        ``height``, ``duration``: mlx-vlm's ``VideoMetadata`` fields).

    Raises:
        MediaError: not a video, no frames, or too few to sample.
    """
    import numpy as np

    frames, rate = _frames(data, where)
    total = len(frames)
    low = math.ceil(MIN_FRAMES / FRAME_FACTOR) * FRAME_FACTOR
    high = math.floor(min(MAX_FRAMES, total) / FRAME_FACTOR) * FRAME_FACTOR
    count = min(max(total / rate * FPS, low), high, total)
    count = math.floor(count / FRAME_FACTOR) * FRAME_FACTOR
    if count < FRAME_FACTOR:
        raise MediaError(f"{where}: the video has too few frames ({total})", param=where)
    indices = np.linspace(0, total - 1, count).round().astype(int)
    clip = np.transpose(np.stack([frames[i] for i in indices]), (0, 3, 1, 2))
    meta = {
        "total_num_frames": total,
        "fps": rate,
        "frames_indices": indices.tolist(),
        "height": int(clip.shape[2]),
        "width": int(clip.shape[3]),
        "duration": total / rate,
    }
    return clip, meta
