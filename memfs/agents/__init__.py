"""One home per agent (issue 53): ``memfs/agents/<agent>/`` holds how memfs reads that agent's
records and writes its native format. The origin of a log (which agent wrote it:
:mod:`memfs.agents.origin`) is re-exported here under its former names.
"""

from __future__ import annotations

from memfs.agents.origin import (  # noqa: F401  (the names memfs.agents always had)
    CLAUDE,
    CLAUDE_CODE,
    CODEX,
    HEAD_BYTES,
    UNKNOWN,
    VTCODE,
    Origin,
    agent_name,
    run_local_id,
)
