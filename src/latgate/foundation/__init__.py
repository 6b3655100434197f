"""The bottom layer: config, the error tree, metrics, logs (imports no other layer)."""
