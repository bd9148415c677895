"""Benchmark: DRA selector compile/eval time in claims.cel vs the two maintained Python CEL libraries.

Run: .venv/bin/python bench/bench_cel.py   (the libraries are optional; missing ones are skipped)
Target: claims.cel evaluates a typical selector on one device in < 20 us; the allocator replay of a
16-GPU dynamic-MIG node runs with far fewer selector evaluations than devices.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from claims.cel import compile_selector, device_view, evaluate

EXPRESSIONS = [
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "device.attributes['gpu.nvidia.com'].profile in ['1g.10gb','2g.20gb']",
    "device.attributes['gpu.nvidia.com'].productName.matches('^NVIDIA H(100|200)')",
    "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
]
PROFILE_7G = "device.attributes['gpu.nvidia.com'].profile == '7g.80gb'"
DEVICE: dict[str, Any] = {
    "name": "gpu-0",
    "attributes": {
        "type": {"string": "gpu"},
        "profile": {"string": "1g.10gb"},
        "productName": {"string": "NVIDIA H100 80GB HBM3"},
        "uuid": {"string": "GPU-0000"},
        "driverVersion": {"version": "580.95.5"},
    },
    "capacity": {"memory": {"value": "80Gi"}},
}
# Plain-data form for the libraries (capacity as an int: neither can carry a Quantity value).
PLAIN = {
    "driver": "gpu.nvidia.com",
    "attributes": {"gpu.nvidia.com": {k: next(iter(v.values())) for k, v in DEVICE["attributes"].items()}},
    "capacity": {"gpu.nvidia.com": {"memory": 80 * 2**30}},
}


def timed(fn: Callable[[], Any], repeat: int) -> float:
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat * 1e6


def bench_ours() -> None:
    view = device_view("gpu.nvidia.com", DEVICE)
    for expr in EXPRESSIONS:
        compile_us = timed(partial(compile_selector.__wrapped__, expr), 200)
        selector = compile_selector(expr)
        eval_us = timed(partial(evaluate, selector, view), 5000)
        print(f"  claims.cel        compile {compile_us:8.1f} us  eval {eval_us:7.2f} us  {expr[:60]}")


def bench_rust() -> None:
    try:
        cel: Any = importlib.import_module("cel")
    except ImportError:
        print("  cel (common-expression-language) not installed: skipped")
        return
    for expr in EXPRESSIONS:
        compile_us = timed(partial(cel.compile, expr), 200)
        program = cel.compile(expr)

        def run(p: Any = program) -> Any:
            ctx = cel.Context()
            ctx.add_variable("device", PLAIN)  # one conversion per device, as the allocator would need
            ctx.add_function("quantity", lambda s: 40 * 2**30)
            ctx.add_function("compareTo", lambda a, b: (a > b) - (a < b))
            return p.execute(ctx)

        eval_us = timed(run, 2000)
        print(f"  cel (Rust)        compile {compile_us:8.1f} us  eval {eval_us:7.2f} us  {expr[:60]}")


def _celpy_eval(program: Any, celpy: Any) -> Any:
    return program.evaluate({"device": celpy.json_to_cel(PLAIN)})


def bench_celpy() -> None:
    try:
        celpy: Any = importlib.import_module("celpy")
        celtypes: Any = importlib.import_module("celpy.celtypes")
    except ImportError:
        print("  cel-python not installed: skipped")
        return
    env = celpy.Environment()
    functions = {
        "quantity": lambda s: celtypes.IntType(40 * 2**30),
        "compareTo": lambda a, b: celtypes.IntType((a > b) - (a < b)),
    }
    for expr in EXPRESSIONS:
        compile_us = timed(partial(env.compile, expr), 50)
        program = env.program(env.compile(expr), functions=functions)
        eval_us = timed(partial(_celpy_eval, program, celpy), 300)
        print(f"  cel-python        compile {compile_us:8.1f} us  eval {eval_us:7.2f} us  {expr[:60]}")


def bench_allocator() -> None:
    try:
        from claims.allocator import FleetSnapshot, allocate
        from simulator import nvidia as nv
    except ImportError as exc:
        print(f"  allocator bench skipped: {exc}")
        return
    objs = nv.device_classes() + nv.node_slices("n1", "H100", mode="dynamic-mig", gpus=16)
    snapshot = FleetSnapshot.from_objects([*objs, nv.node_object("n1", "H100", gpus=16)])
    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "mig",
                        "exactly": {
                            "deviceClassName": "mig.nvidia.com",
                            "allocationMode": "All",
                            "selectors": [{"cel": {"expression": PROFILE_7G}}],
                        },
                    }
                ]
            }
        },
    }
    start = time.perf_counter()
    result = allocate([claim], "n1", snapshot)
    ms = (time.perf_counter() - start) * 1e3
    stats = snapshot.stats
    print(
        f"  allocate All-mode on a 16-GPU dynamic-MIG node: {ms:.1f} ms, ok={result.ok}, "
        f"selector evaluations {stats.evaluations}, saved {stats.saved}"
    )


def main() -> None:
    print(f"Python {sys.version.split()[0]}")
    print("compile time per expression, eval time per device:")
    bench_ours()
    bench_rust()
    bench_celpy()
    print("allocator:")
    bench_allocator()


if __name__ == "__main__":
    main()
