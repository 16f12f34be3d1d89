"""``python tests/launch_dying_rank.py N ARGS...``: the xstage command line ARGS, whose rank 1 stops dead
(``os._exit``, no message, no cleanup) as it starts measuring its N-th burst-gap configuration: a rank that dies
mid-sweep (tests/test_launchers.py)."""
import os
import sys

from xstage import burst_gap_sweep, cli

STOP_AT = int(sys.argv[1])
_calls = [0]
_measure = burst_gap_sweep.measure_point


def measure_point(world, *args, **kwargs):
    _calls[0] += 1
    if getattr(world, "rank", 0) == 1 and _calls[0] == STOP_AT:
        os._exit(17)
    return _measure(world, *args, **kwargs)


burst_gap_sweep.measure_point = measure_point
raise SystemExit(cli.main(sys.argv[2:]))
