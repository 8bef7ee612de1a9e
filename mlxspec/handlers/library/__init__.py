"""The model library's routes: ``/library``, ``/downloads``, ``/api/hub/*``,
``/api/gc/*``, ``/api/model/resolve-folder`` (reference sections "GET /library",
"GET /downloads", "Model Hub", "GET /api/gc/plan", "Quantize"). They translate
between the wire and :mod:`mlxspec.library`, which holds the work; folder scans
and deletions run off the event loop."""
