"""The keys latgate adds to an ASGI connection scope, so the layers that set a value and
the layers that read it share one name without importing each other.

The protocol (:mod:`latgate.app.httplimits`) writes :data:`TIMEOUT_SCOPE_KEY`; the serve
path and the relay read it. The gateway writes :data:`REQUEST_ID_SCOPE_KEY`; the
protocol reads it for a 408 it writes itself. Keys are namespaced ``latgate.`` as the
ASGI specification asks of extensions' scope keys (ASGI HTTP connection scope).
"""

#: Where a client timeout met during a request is noted: ``header_timeout``,
#: ``body_timeout`` or ``send_timeout``.
TIMEOUT_SCOPE_KEY = "latgate.client_timeout"
#: where the app puts the request id it logs (:meth:`Gateway.new_exchange`), so a 408
#: the protocol writes carries the id of the request's access line
REQUEST_ID_SCOPE_KEY = "latgate.request_id"
