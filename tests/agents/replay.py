"""A stand-in agent: prints a recorded stream line by line with a short pause between lines
(its own timers only), then exits with the given status — or, with ``--crash-after N``, kills
itself with SIGKILL after N lines, mid-turn, as a crashing agent would."""

import argparse
import os
import signal
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("stream")
parser.add_argument("--status", type=int, default=0)
parser.add_argument("--crash-after", type=int)
parser.add_argument("--pause", type=float, default=0.005)
parser.add_argument("--stderr", default="")
args = parser.parse_args()
if args.stderr:
    sys.stderr.write(args.stderr)
    sys.stderr.flush()
with open(args.stream, "rb") as stream:
    for n, line in enumerate(stream, 1):
        # write in two pieces, as a real agent's buffered writes may split a line
        half = len(line) // 2
        sys.stdout.buffer.write(line[:half])
        sys.stdout.flush()
        sys.stdout.buffer.write(line[half:])
        sys.stdout.flush()
        time.sleep(args.pause)
        if args.crash_after == n:
            os.kill(os.getpid(), signal.SIGKILL)
sys.exit(args.status)
