"""Top functions of a py-spy ``--format raw`` profile (collapsed stacks), by inclusive and own samples.

python bench/e2e/profile_top.py .run/e2e/profile-web.txt [30] [filter]
"""

from __future__ import annotations

import sys
from collections import Counter


def main(path: str, top: str = "30", only: str = "") -> int:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, _, count = line.rstrip().rpartition(" ")
            if not stack or (only and only not in stack):
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            for frame in set(frames):
                inclusive[frame] += n
            own[frames[-1]] += n
    print(f"{total} samples")
    print("inclusive:")
    for frame, n in inclusive.most_common(int(top)):
        print(f"{100 * n / total:5.1f}%  {frame}")
    print("own:")
    for frame, n in own.most_common(int(top) // 2):
        print(f"{100 * n / total:5.1f}%  {frame}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
