"""GPU catalog: memory, dense peak compute, HBM and interconnect bandwidth (vendor datasheets).

``interconnect_gb_per_s`` is one direction per GPU (NVLink for SXM parts, PCIe for L40S).
GPUs without FP8 tensor cores list their BF16 peak as ``fp8_tflops``.
"""

from __future__ import annotations

from actors.engine.geometry import HardwareSpec
from simulator.errors import InputError

HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec("a100_sxm", memory_gb=80, bf16_tflops=312.0, fp8_tflops=312.0, hbm_tb_per_s=2.039, interconnect_gb_per_s=300),
        HardwareSpec("h100_sxm", memory_gb=80, bf16_tflops=989.4, fp8_tflops=1978.9, hbm_tb_per_s=3.35, interconnect_gb_per_s=450),
        HardwareSpec("h200_sxm", memory_gb=141, bf16_tflops=989.4, fp8_tflops=1978.9, hbm_tb_per_s=4.8, interconnect_gb_per_s=450),
        HardwareSpec("b200_sxm", memory_gb=180, bf16_tflops=2250.0, fp8_tflops=4500.0, hbm_tb_per_s=8.0, interconnect_gb_per_s=900),
        HardwareSpec("gb200", memory_gb=186, bf16_tflops=2500.0, fp8_tflops=5000.0, hbm_tb_per_s=8.0, interconnect_gb_per_s=900),
        HardwareSpec("l40s", memory_gb=48, bf16_tflops=362.1, fp8_tflops=733.0, hbm_tb_per_s=0.864, interconnect_gb_per_s=32),
    )
}


def get_hardware(name: str, field: str = "engine.hardware") -> HardwareSpec:
    spec = HARDWARE.get(name)
    if spec is None:
        raise InputError(field, f"unknown hardware {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return spec
