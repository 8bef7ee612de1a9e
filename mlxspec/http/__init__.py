"""The HTTP edge: the ASGI app, Connexion dispatch, exact paths, CORS, API
keys, the one SSE writer and request metrics."""
