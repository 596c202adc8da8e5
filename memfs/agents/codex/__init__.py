"""Codex: ``shapes`` (its table and the rollout's small readers), ``read`` (``exec --json``
passed through, rollout files → events), ``write`` (a conversation as a rollout ``codex exec
resume`` continues)."""
