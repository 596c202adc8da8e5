"""OpenCode: ``shapes`` (its table), ``store`` (its SQLite database, read-only), ``read``
(``run --format json`` and the database → events), ``write`` (a conversation as a file
``opencode import`` reads)."""
