"""One request's routing and auth, tracing, API translation."""
