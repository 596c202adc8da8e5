"""``python -m memfs``: the command line."""

from memfs.cli import main

raise SystemExit(main())
