"""The ``kv_tiers`` section of a summary: host (G2) and disk (G3) KV tier traffic, summed over
the ranks (a shared tier counted once), and the prompt reuse split by the tier it came from.
Field meanings: docs/kv-offload.md."""

from __future__ import annotations

_LINK = ("jobs", "blocks", "bytes", "transfer_ms", "busy_ms")


def _sum_links(parts: list[dict]) -> dict:
    out = {k: 0 for k in _LINK}
    for p in parts:
        for k in _LINK:
            out[k] += p[k]
    return out


def _occupancy(tiers: list[dict], keys: tuple) -> dict:
    """One shared tier's numbers, or the private tiers' sums."""
    if tiers and tiers[0].get("shared"):
        return {k: tiers[0][k] for k in keys}
    return {k: sum(t[k] for t in tiers) for k in keys}


def kv_tier_summary(reports: list, reused_tokens: int, host_reused_tokens: int, input_tokens: int) -> dict:
    """``reports``: (worker, per rank ``RankOffload.report()``) of every worker with tiers."""
    ranks = [r for _, per in reports for r in per]
    tiers = [r["tier"] for r in ranks]
    host = _occupancy(tiers, ("capacity_blocks", "resident_blocks", "used_blocks", "evictions"))
    host.update(
        scope="cluster_shared" if tiers and tiers[0]["shared"] else "dp_rank_local",
        lookups=sum(r["g2_lookups"] for r in ranks),
        hit_lookups=sum(r["g2_hit_lookups"] for r in ranks),
        hit_blocks=sum(r["g2_hit_blocks"] for r in ranks),
        store_retries=sum(r["store_retries"] for r in ranks),
        offload=_sum_links([r["offload"] for r in ranks]),
        onboard=_sum_links([r["onboard"] for r in ranks]),
    )
    out = {"host": host}
    g3 = [r for r in ranks if "g3" in r]
    if g3:
        stores = [r["g3"] for r in g3]
        disk = _occupancy(stores, ("capacity_blocks", "resident_blocks", "pending_blocks", "lookup_probes",
                                   "lookup_hits", "lookup_pending", "evictions", "cross_worker_read_blocks"))
        disk["scope"] = "cluster_shared" if stores[0]["shared"] else "worker_local"
        disk["read"] = _sum_links([r["g3_read"] for r in g3])
        disk["write"] = _sum_links([r["g3_write"] for r in g3])
        out["disk"] = disk
    device = reused_tokens - host_reused_tokens
    out["reuse"] = {
        "first_admission_device_tokens": device,
        "first_admission_host_tokens": host_reused_tokens,
        "first_admission_device_ratio": device / input_tokens if input_tokens else 0.0,
        "first_admission_host_ratio": host_reused_tokens / input_tokens if input_tokens else 0.0,
    }
    return out
