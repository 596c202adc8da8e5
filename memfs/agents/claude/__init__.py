"""Claude Code: ``shapes`` (its table), ``read`` (stream-json and transcripts → events, with
``tools``: its tool calls → items, and what an export folded into text), ``write`` (a
conversation as a transcript ``claude --resume`` continues)."""
