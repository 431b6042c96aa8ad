"""Decision policies of the SLA target: how a role's count follows from the perf model's
estimates. The Planner applies the common gates (workers starting, no records, records not
covering the ready workers) and then asks its policy for each role; a policy returns
``(target or None, reason, per-engine diagnostics)``.

``dynamo`` (the default and, for now, the only one) is the live Dynamo Planner's rule set:

- idle rule: when every engine's latest record is empty (nothing scheduled, nothing queued),
  scale down by one without consulting the model;
- up to N + 1 when every engine's TTFT estimate is above the TTFT SLA, or every engine's ITL
  estimate is above the ITL SLA (an engine whose store is not ready votes no);
- down to max(N - 1, floor) only when both sides pass their consolidation checks on every
  engine. With c = N / (N - 1) and s = sensitivity / 100: the TTFT side needs the queue-driven
  part of the consolidated TTFT below (SLA - own-request TTFT) x s, the own request priced
  with the consolidated decode load; the ITL side needs the consolidated ITL below SLA x s and
  the consolidated KV to fit. A disaggregated role checks only its own side (prefill: TTFT,
  decode: ITL); an aggregated engine both, counting its queued prompts as future decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from aisim.actors.messages import Fpm, RoleState
from aisim.actors.planner.perf_model import Pass, PerfModel


@dataclass(frozen=True)
class PolicyContext:
    settings: object  # PlannerSettings
    hit_rate: float | None  # the last traffic window's KV hit rate (None before the first)
    accept_length: float = 1.0


def pass_of(f: Fpm) -> Pass:
    return Pass(f.num_prefill, f.prefill_tokens, f.prefill_kv_tokens, f.num_decode, f.decode_kv_tokens)


def _queued(f: Fpm) -> bool:
    return bool(f.queued_prefill or f.queued_decode)


class DynamoPolicy:
    """The live Dynamo Planner's SLA rules (see the module doc)."""

    name = "dynamo"

    def propose(self, role: str, st: RoleState, model: PerfModel,
                ctx: PolicyContext) -> tuple[int | None, str, list[dict]]:
        s = ctx.settings
        n = len(st.active)
        floor = s.floor(role)
        if all(pass_of(f).empty and not _queued(f) for f in st.fpms):
            idle = [{"worker_id": f.worker_id, "dp_rank": f.dp_rank, "idle": True} for f in st.fpms]
            return (n - 1, "scale_down_idle", idle) if n > floor else (None, "no_change", idle)
        sens = s.load_scaling_down_sensitivity / 100.0
        h = None if ctx.hit_rate is None else min(max(ctx.hit_rate, 0.0), 0.95)
        c = n / (n - 1) if n > 1 else 1.0
        ttft_side = role == "prefill" or s.mode == "agg"
        itl_side = role == "decode"
        engines = []
        for f in st.fpms:
            e: dict = {"worker_id": f.worker_id, "dp_rank": f.dp_rank}
            dec_n = f.num_decode + f.queued_decode
            dec_kv = f.decode_kv_tokens + f.queued_decode_kv_tokens
            if ttft_side:
                ttft, passes = model.ttft_ms(f.queued_prefill, f.queued_prefill_tokens, f.num_decode,
                                             f.decode_kv_tokens, h)
                own, _ = model.ttft_ms(0, 0, dec_n * c, dec_kv * c, h)
                post, _ = model.ttft_ms(f.queued_prefill * c, f.queued_prefill_tokens * c, dec_n * c, dec_kv * c, h)
                budget = None if own is None else (s.ttft_ms - own) * sens
                e.update(ttft_ms=ttft, ttft_store=passes[0]["store"], ttft_ready=ttft is not None,
                         ttft_up=ttft is not None and ttft > s.ttft_ms,
                         ttft_down=own is not None and post is not None and budget > 0 and post - own < budget,
                         ttft_own_ms=own, ttft_consolidated_ms=post)
            if itl_side:
                itl, info = model.itl_ms(dec_n, dec_kv, ctx.accept_length)
                if s.mode == "agg":  # queued prompts will decode here too
                    dn_c, kv_c = (dec_n + f.queued_prefill) * c, (dec_kv + f.queued_prefill_tokens) * c
                else:
                    dn_c, kv_c = dec_n * c, dec_kv * c
                itl_c, _ = model.itl_ms(dn_c, kv_c, ctx.accept_length)
                e.update(itl_ms=itl, itl_store=info["store"], itl_ready=itl is not None,
                         itl_up=itl is not None and itl > s.itl_ms,
                         itl_down=itl_c is not None and itl_c < s.itl_ms * sens and kv_c < st.caps.max_kv_tokens,
                         itl_consolidated_ms=itl_c)
            engines.append(e)
        up = (ttft_side and all(e["ttft_up"] for e in engines)) or (itl_side and all(e["itl_up"] for e in engines))
        down = all((not ttft_side or e["ttft_down"]) and (not itl_side or e["itl_down"]) for e in engines)
        if up:
            return n + 1, "scale_up", engines
        if (n > 1 or st.starting) and down:
            return max(n - 1, floor), "scale_down", engines
        if any(not e.get("ttft_ready", True) or not e.get("itl_ready", True) for e in engines):
            return None, "insufficient_data", engines  # a store the estimates need holds too few samples
        return None, ("scale_down_refused_consolidation" if n > floor and not down else "no_change"), engines


POLICIES: dict[str, type] = {"dynamo": DynamoPolicy}
