#!/usr/bin/env python3
"""Where a process's time went, from py-spy's raw (collapsed) stacks: per thread, the functions
with the most samples of their own and the most samples inside them.

    py-spy record --pid PID --format raw --threads [--idle] --output engine.txt ...
    python3 benchmarks/stack_top.py engine.txt [--top 25] [--min-share 0.02]

Each line of py-spy's raw output is one distinct stack, `thread (TID): NAME;frame;frame COUNT`,
with a frame as `function (file:line)`. Lines are dropped from frames here, so that a
function's samples add up over all its lines. With --idle, samples where the thread waited
(on a lock, a socket, the GPU) count too: the shares are then of wall time, not CPU time.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^():]*)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """`Scheduler.schedule (/x/vllm/v1/core/sched/scheduler.py:312)` -> `Scheduler.schedule (sched/scheduler.py)`."""
    match = FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = Path(match["file"])
    return f"{match['function']} ({'/'.join(path.parts[-2:])})"


def read_stacks(path: Path) -> dict[str, Counter]:
    """Thread name -> Counter of stacks (tuples of frame names, outermost first)."""
    threads: dict[str, Counter] = defaultdict(Counter)
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        threads[re.sub(r"^thread \(\d+\): ", "", thread)][tuple(frame_name(f) for f in frames)] += int(count)
    return threads


def summarize(stacks: Counter, top: int, min_share: float) -> list[str]:
    total = sum(stacks.values())
    own: Counter = Counter()
    inside: Counter = Counter()
    for frames, count in stacks.items():
        if frames:
            own[frames[-1]] += count
        for name in set(frames):
            inside[name] += count
    lines = [f"  {total} samples"]
    for title, counter in (("own samples (the function itself was running)", own),
                           ("inclusive samples (the function or what it called)", inside)):
        lines.append(f"  {title}:")
        for name, count in counter.most_common(top):
            if count / total < min_share:
                break
            lines.append(f"    {100 * count / total:5.1f}%  {name}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("raw", type=Path, help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=25, help="functions per list (default 25)")
    parser.add_argument("--min-share", type=float, default=0.02,
                        help="leave out functions under this share of the thread's samples (default 0.02)")
    args = parser.parse_args(argv)
    threads = read_stacks(args.raw)
    if not threads:
        print(f"{args.raw}: no stacks", file=sys.stderr)
        return 1
    for thread, stacks in sorted(threads.items(), key=lambda item: -sum(item[1].values())):
        print(f"thread {thread}")
        print("\n".join(summarize(stacks, args.top, args.min_share)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
