"""Media for vision-language models: decoding images (Pillow) and fetching them
under the remote-media destination policy (:mod:`.fetch`); nothing here imports
MLX or mlx-vlm, so handlers and the prompt threads can use it cheaply."""

from mlxspec.engine.media.fetch import FetchPolicy, MediaUrlRejected, fetch_media
from mlxspec.engine.media.images import MediaError, decode_image, load_image_source

__all__ = [
    "FetchPolicy",
    "MediaError",
    "MediaUrlRejected",
    "decode_image",
    "fetch_media",
    "load_image_source",
]
