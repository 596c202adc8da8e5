"""Floor 2: one session on disk — the log, its metadata, locking and store operations."""
