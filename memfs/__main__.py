"""``python -m memfs``: the command line."""

from memfs.cli import main

if __name__ == "__main__":  # (not when a helper process imports it as its parent's main module)
    raise SystemExit(main())
