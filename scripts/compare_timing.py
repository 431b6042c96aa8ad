#!/usr/bin/env python
"""Roofline vs measured (timing.type: default) pass times for a few shapes, side by side.

    python scripts/compare_timing.py                                   # three models on h200_sxm
    python scripts/compare_timing.py --model Qwen/Qwen3-32B-FP8 --hardware h100_sxm --tensor 2

The measured model is aiconfigurator-core's kernel data (first run builds and caches its
tables, ~2 s per configuration); the roofline is aisim's analytical model with its default
efficiency factors. Works offline (bundled model configs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from aisim.actors.engine.timing import PassShape, RooflineTiming  # noqa: E402
from aisim.simulator.catalog.hardware import get_hardware  # noqa: E402
from aisim.simulator.catalog.measured import measured_timing  # noqa: E402
from aisim.simulator.catalog.models import geometry_of, resolve_model  # noqa: E402
from aisim.simulator.errors import AisimError  # noqa: E402

TOTAL_KV = 10**7


def shapes():
    def pre(n, new, prefix=0):
        return PassShape(n, n * new, n * (new + prefix), n * prefix)

    def dec(b, ctx):
        return PassShape(num_decode=b, decode_kv_tokens=b * ctx, total_kv_tokens=TOTAL_KV)

    yield "prefill 1 x 512", pre(1, 512)
    yield "prefill 1 x 2048", pre(1, 2048)
    yield "prefill 1 x 8192", pre(1, 8192)
    yield "prefill 4 x 2048", pre(4, 2048)
    yield "prefill 2048 over 16k cached", pre(1, 2048, 16384)
    yield "decode b=1 ctx 2k", dec(1, 2000)
    yield "decode b=16 ctx 2k", dec(16, 2000)
    yield "decode b=64 ctx 2k", dec(64, 2000)
    yield "decode b=256 ctx 2k", dec(256, 2000)
    yield "decode b=64 ctx 16k", dec(64, 16000)
    yield "mixed 2048 prefill + 64 decodes", PassShape(1, 2048, 2048, 0, 64, 64 * 4000, TOTAL_KV)


def compare(model: str, hardware: str, tensor: int) -> None:
    src = resolve_model(model)
    roof = RooflineTiming(geometry_of(src), get_hardware(hardware), tensor)
    try:
        meas = measured_timing(src, hardware, "vllm", None, tensor=tensor)
    except AisimError as exc:
        print(f"\n{model} on {hardware} tp={tensor}: {exc}")
        return
    print(f"\n{model} on {hardware}, tensor {tensor}  ({meas.describe()['data_version']})")
    print(f"{'shape':34} {'measured ms':>12} {'roofline ms':>12} {'roof/meas':>10}")
    for name, shape in shapes():
        m = meas.pass_ms(shape)
        r = roof.pass_ms(shape)
        print(f"{name:34} {m:12.3f} {r:12.3f} {r / m:10.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", help="model id or directory (repeatable)")
    ap.add_argument("--hardware", default="h200_sxm")
    ap.add_argument("--tensor", type=int, default=1)
    args = ap.parse_args()
    models = args.model or ["meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-32B-FP8", "Qwen/Qwen3-30B-A3B"]
    for model in models:
        compare(model, args.hardware, args.tensor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
