"""Speech to text: ``/v1/audio/transcriptions``, ``/v1/audio/translations``,
dictation sessions (``/v1/audio/sessions``) and ``/admin/transcription/unload``.

The handlers translate the wire (multipart as OpenAI's SDK sends it, or JSON
with base64 audio) to :mod:`mlxspec.engine.audio` and its results back to
``json``/``verbose_json``/``text``/``srt``/``vtt`` or an event stream.
"""
