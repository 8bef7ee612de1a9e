"""LoRA adapters on the served model: mounted at start or over HTTP, chosen per
request, mixed per row in one batch.

:mod:`.files` reads adapter folders as ``mlx_lm.lora`` saves them; :mod:`.mount`
mounts one through mlx-lm's tuner (``load_adapters``); :mod:`.mixing` holds the
layers that apply each row's adapters; :mod:`.registry` is what the engine and
the routes share (ids, slots, leases, the prompt-cache namespace of a selection);
:mod:`.spec` parses the ``adapter`` field. Whoever calls the model selects its
rows' adapters first (the lone decode loop, the batch's ``DecodeBatch.forward``
for decode and prefill chunks alike, the ``n``-sibling prefill).
"""
