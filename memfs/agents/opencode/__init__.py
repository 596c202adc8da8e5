"""opencode: read (ingest) and write (export) of its records."""
