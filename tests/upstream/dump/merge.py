"""Merge the incubating and experimental recordings into one case per upstream table entry.

The incubating recording wins (claimscope replays that allocator); cases only the experimental allocator runs
(features the incubating one does not support) come from the experimental recording. Fields upstream leaves
empty are dropped so the file stays readable; the node keeps only its metadata.
"""

import json
import sys
from typing import Any


def prune(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    if isinstance(value, list):
        return [prune(v) for v in value]
    return value


def main() -> None:
    version, incubating, experimental = sys.argv[1:4]
    cases: dict[str, dict[str, Any]] = {}
    channels: dict[str, list[str]] = {}
    for path in (experimental, incubating):
        with open(path) as f:
            recorded = json.load(f)
        for case in recorded:
            name = case["name"]
            if name.startswith("interrupt/"):
                continue  # context cancellation of the Go call, nothing to replay
            channels.setdefault(name, []).append(case["channel"])
            case["node"] = {"metadata": case["node"]["metadata"]}
            cases[name] = case
    out = []
    for name in sorted(cases):
        case = cases[name]
        case["channels"] = sorted(channels[name])
        case["features"] = sorted(k for k, v in case["features"].items() if v)
        for result in case.get("results") or []:
            for device in result["devices"].get("results") or []:
                if device.get("shareID"):
                    device["shareID"] = "<generated>"  # a fresh UID per run
        out.append(prune(case))
    # One case per line keeps diffs between upstream versions readable.
    lines = ",\n".join(json.dumps(case, separators=(",", ":"), sort_keys=True) for case in out)
    sys.stdout.write(f'{{"source":"k8s.io/dynamic-resource-allocation@{version}","cases":[\n{lines}\n]}}\n')


if __name__ == "__main__":
    main()
