"""Host (G2) KV offload side by side with the reference simulator on the full conversation trace
(12,031 requests, 1 h): 2 vLLM workers of 8,000 GPU blocks of 64 tokens each, round robin or the KV
router, no host tier, 60,000 host blocks per rank at 32 or 8 GB/s, or one 120,000-block pool for the
cluster. The reference's numbers are recorded here (its `aisimulate predict --stack dynamo` on the same
YAML, BENCHMARKS.md "KV tiers"); every compared metric must stay within 3% with polynomial timing and
5% with measured timing. Slow: a few seconds per replay."""

from __future__ import annotations

import pytest

from aisim import run_config
from aisim.simulator.config.loading import validate_config
from tests.conftest import ROOT

TRACE = ROOT.parent / "shared" / "traces" / "conversation_trace.jsonl"
MODEL = "nvidia/Llama-3.1-8B-Instruct-FP8"  # (the reference ran its local copy of the same config.json)
METRICS = ("completed_requests", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
           "mean_e2e_latency_ms", "output_throughput_tok_s", "goodput_output_throughput_tok_s",
           "prefix_cache_reused_ratio")
HOST = {
    "none": None,
    "g2": {"num_host_blocks": 60000},
    "g2slow": {"num_host_blocks": 60000, "d2h_bandwidth_gbps": 8, "h2d_bandwidth_gbps": 8},
    "shared": {"scope": "cluster_shared", "num_host_blocks": 120000},
}

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not TRACE.exists(), reason=f"{TRACE} (the shared Mooncake trace) is not here")]


def config(host: str, router: str, timing: str) -> dict:
    worker = {"parallelism": {"replicas": 2}, "scheduler": {"max_batched_tokens": 8192, "max_sequences": 256},
              "kv_cache": {"block_size": 64, "capacity": {"type": "fixed", "blocks": 8000}},
              "timing": {"type": timing}}
    if HOST[host] is not None:
        worker["kv_cache"]["host_offload"] = HOST[host]
    return {"traffic": {"source": {"type": "trace", "format": "mooncake", "paths": [str(TRACE)], "block_size": 512},
                        "load": {"type": "trace_timestamps"}},
            "engine": {"mode": "aggregated", "model": MODEL, "hardware": "h200_sxm", "backend": "vllm",
                       "workers": {"aggregated": worker}},
            "router": {"policy": "kv_router" if router == "kv" else "round_robin"},
            "evaluation": {"sla": {"ttft_ms": 2000, "itl_ms": 50}}}


# (host tier, router, timing) -> the reference's summary, in METRICS' order
REFERENCE = {
    ("none", "rr", "polynomial"): (12031, 4593.631, 1820.825, 36222.64, 51.88358, 22318.04, 1159.422, 298.583,
                                   0.05849664),
    ("g2", "rr", "polynomial"): (12031, 2308.341, 998.6735, 16540.28, 45.54941, 17868.88, 1159.77, 573.971,
                                 0.1728944),
    ("g2", "kv", "polynomial"): (12031, 1220.901, 805.4097, 6914.354, 44.72791, 16500.8, 1160.936, 720.202,
                                 0.2013858),
    ("g2slow", "rr", "polynomial"): (12031, 2382.961, 1012.168, 17450.61, 45.62928, 17970.78, 1159.768, 569.0105,
                                     0.1739097),
    ("shared", "rr", "polynomial"): (12031, 1577.064, 775.7873, 11876.41, 41.06257, 15604.81, 1159.915, 779.951,
                                     0.2674602),
    ("g2", "rr", "default"): (12031, 1714.308, 743.6419, 10999.96, 14.27694, 6591.58, 1161.466, 856.3364, 0.1694508),
    ("g2", "kv", "default"): (12031, 1040.825, 613.5778, 7417.82, 11.99031, 5136.942, 1161.891, 1002.328, 0.2031486),
    ("g2slow", "rr", "default"): (12031, 1727.338, 753.7909, 11106.3, 14.23271, 6589.5, 1161.447, 855.0643,
                                  0.1693982),
    ("shared", "rr", "default"): (12031, 1494.887, 606.6173, 10431.28, 12.11658, 5634.141, 1161.554, 909.574,
                                  0.2658818),
}


@pytest.mark.parametrize("case", list(REFERENCE), ids=lambda c: "-".join(c))
def test_host_offload_matches_the_reference(case):
    host, router, timing = case
    summary = run_config(validate_config(config(host, router, timing))).summary
    tolerance = 3.0 if timing == "polynomial" else 5.0
    ref = dict(zip(METRICS, REFERENCE[case], strict=True))
    off = {k: round((summary[k] - ref[k]) / ref[k] * 100, 2) for k in METRICS}
    assert all(abs(v) <= tolerance for v in off.values()), off
