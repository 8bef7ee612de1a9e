"""The jobs and lab routes (reference, "Jobs", "Fine-tune", "Quantize", "Dataset"),
served only with ``--jobs``: ``jobs`` reads and cancels jobs (the SSE tail of a
job's log included), ``finetune``, ``quantize`` and ``dataset`` submit them and
answer their synchronous helpers. Each translates a body into a job of
:mod:`mlxspec.jobs`; the runners do the work."""
