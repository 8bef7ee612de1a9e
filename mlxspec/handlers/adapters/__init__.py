"""The LoRA adapter surface: ``/v1/adapters`` routes (:mod:`.adapters`) and the
``adapter`` / ``model`` fields that select adapters per request (:mod:`.select`)."""
