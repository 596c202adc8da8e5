"""Gemini CLI: ``shapes`` (its table and its lines' shapes), ``read`` (stream-json and chat files
→ events). No ``write`` yet: memfs exports no Gemini format (Gemini CLI's ``--session-file``,
which loads a session from a JSON file, is where one would go)."""
