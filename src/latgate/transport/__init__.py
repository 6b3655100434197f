"""The upstream HTTP/1.1 client: pool, connections, egress, decoding."""
