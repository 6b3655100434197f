"""Start, drain, signals, workers: the gateway as a process."""
