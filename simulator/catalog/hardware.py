"""GPU catalog: memory, dense peak compute, HBM and interconnect bandwidth.

Values follow the vendor datasheets as aiconfigurator-core's system files state them (memory
in bytes as the driver reports it, e.g. 141 GiB for an H200). ``interconnect_gb_per_s`` is
one direction per GPU (NVLink for SXM parts, PCIe for L40S). GPUs without FP8 tensor cores
list their BF16 peak as ``fp8_tflops``.
"""

from __future__ import annotations

from aisim.actors.engine.geometry import HardwareSpec
from aisim.simulator.errors import InputError

GIB = 1 << 30

HARDWARE: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec("a100_sxm", memory_bytes=80 * GIB, bf16_tflops=312.0, fp8_tflops=312.0, hbm_tb_per_s=2.039,
                     interconnect_gb_per_s=300),
        HardwareSpec("h100_sxm", memory_bytes=80 * GIB, bf16_tflops=989.0, fp8_tflops=1978.0, hbm_tb_per_s=3.35,
                     interconnect_gb_per_s=450),
        HardwareSpec("h200_sxm", memory_bytes=141 * GIB, bf16_tflops=989.0, fp8_tflops=1978.0, hbm_tb_per_s=4.8,
                     interconnect_gb_per_s=450),
        HardwareSpec("b200_sxm", memory_bytes=180 * GIB, bf16_tflops=2250.0, fp8_tflops=4500.0, hbm_tb_per_s=7.7,
                     interconnect_gb_per_s=900),
        HardwareSpec("gb200", memory_bytes=198_674_743_296, bf16_tflops=2500.0, fp8_tflops=5000.0, hbm_tb_per_s=8.0,
                     interconnect_gb_per_s=900),
        HardwareSpec("l40s", memory_bytes=48_305_799_168, bf16_tflops=362.05, fp8_tflops=733.0, hbm_tb_per_s=0.864,
                     interconnect_gb_per_s=32),
    )
}


def get_hardware(name: str, field: str = "engine.hardware") -> HardwareSpec:
    spec = HARDWARE.get(name)
    if spec is None:
        raise InputError(field, f"unknown hardware {name!r}; known: {', '.join(sorted(HARDWARE))}")
    return spec
