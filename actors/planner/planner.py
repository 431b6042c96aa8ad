"""The Planner actor: every tick it reads a snapshot of the deployment and decides replicas.

Replay contract (as the reference): the coordinator calls ``initial_tick_ms()`` once, then
``on_tick(snapshot)`` which returns a ``Decision`` ``{target_prefill, target_decode,
next_tick_ms}`` (absolute counts, None = unchanged; next tick None = stop). Aggregated workers
are the *decode* role. Tick order: observe -> feed forward-pass metrics to the perf models ->
throughput proposal (when due) -> load proposal (when due) -> merge -> floors and GPU budget
-> project ``scale_to`` -> record (execution is the coordinator's, skipped in advisory mode).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from aisim.actors.messages import Capabilities, Decision, Fpm, RoleState, Snapshot
from aisim.actors.planner.perf_model import CROSS_RANK, MIXED, PURE_DECODE, PURE_PREFILL, PerfModel
from aisim.actors.planner.policy import POLICIES, PolicyContext, pass_of
from aisim.actors.planner.predictors import Predictor, PredictorSpec

EPS = 1e-9


@dataclass(frozen=True)
class PlannerSettings:
    mode: str  # agg | disagg
    target: str = "throughput"  # throughput | latency | load | sla
    enable_throughput_scaling: bool = False  # effective (after the target rules)
    enable_load_scaling: bool = True
    throughput_interval_s: float = 180.0
    load_interval_s: float = 5.0
    tick_interval_s: float = 5.0
    max_throughput_scaling_replicas: int = 8
    max_num_fpm_samples: int = 64
    fpm_sample_bucket_size: int = 16
    load_scaling_down_sensitivity: int = 80
    load_min_observations: int = 5
    predictor: PredictorSpec = PredictorSpec()
    advisory: bool = False
    max_gpu_budget: int = 8  # negative: no ceiling
    min_gpu_budget: int = -1  # negative: no floor
    min_endpoint: int = 1
    prefill_min_endpoint: int | None = None
    decode_min_endpoint: int | None = None
    ttft_ms: float = 500.0
    itl_ms: float = 50.0
    prefill_scale_up_queue_tokens: float | None = None
    prefill_scale_down_queue_tokens: float | None = None
    decode_scale_up_kv_rate: float | None = None
    decode_scale_down_kv_rate: float | None = None
    prefill_engine_num_gpu: int = 1
    decode_engine_num_gpu: int = 1
    decision_policy: str = "dynamo"  # how the sla target turns estimates into counts (actors.planner.policy)

    @property
    def roles(self) -> tuple[str, ...]:
        return ("prefill", "decode") if self.mode == "disagg" else ("decode",)

    def floor(self, role: str) -> int:
        explicit = self.prefill_min_endpoint if role == "prefill" else self.decode_min_endpoint
        return explicit if explicit is not None else self.min_endpoint

    def gpus(self, role: str) -> int:
        return self.prefill_engine_num_gpu if role == "prefill" else self.decode_engine_num_gpu

    def knob(self, name: str):
        """A runtime knob by its config name (``RUNTIME_KNOBS``)."""
        if name in _PREDICTOR_FIELDS:
            return getattr(self.predictor, _PREDICTOR_FIELDS[name])
        if name in _SETTINGS_FIELDS:
            return getattr(self, name)
        raise ValueError(f"not a Planner runtime field: {name!r}")

    def with_knobs(self, changes: dict) -> PlannerSettings:
        """These settings with runtime knobs changed (config names, ``RUNTIME_KNOBS``)."""
        unknown = set(changes) - set(RUNTIME_KNOBS)
        if unknown:
            raise ValueError(f"not a Planner runtime field: {sorted(unknown)}")
        settings = {k: v for k, v in changes.items() if k in _SETTINGS_FIELDS}
        spec = {_PREDICTOR_FIELDS[k]: v for k, v in changes.items() if k in _PREDICTOR_FIELDS}
        if spec:
            settings["predictor"] = dataclasses.replace(self.predictor, **spec)
        return dataclasses.replace(self, **settings)


# retune may change these at runtime (set_runtime_fields)
_SETTINGS_FIELDS = ("load_scaling_down_sensitivity", "load_min_observations", "max_throughput_scaling_replicas")
_PREDICTOR_FIELDS = {"load_predictor": "family", "load_predictor_log1p": "log1p",
                     "prophet_window_size": "prophet_window_size", "kalman_q_level": "kalman_q_level",
                     "kalman_q_trend": "kalman_q_trend", "kalman_r": "kalman_r", "kalman_min_points": "kalman_min_points"}
PREDICTOR_KNOBS = tuple(_PREDICTOR_FIELDS)  # the load predictor's knobs (config names)
RUNTIME_KNOBS = (*_SETTINGS_FIELDS, *PREDICTOR_KNOBS)

# Static-threshold targets: (prefill up, prefill down, decode/agg up, decode/agg down)
_THRESHOLDS = {"throughput": (1.0, 0.1, 1.0, 0.6), "latency": (0.1, 0.0, 0.4, 0.1)}


@dataclass
class Planner:
    settings: PlannerSettings
    perf_models: dict[str, PerfModel] = field(default_factory=dict)  # role -> model (sla)
    bootstrap: dict = field(default_factory=lambda: {"status": "not_attempted"})
    capture_details: bool = True

    def __post_init__(self) -> None:
        s = self.settings
        self.predictors = {k: Predictor(s.predictor, s.throughput_interval_s) for k in ("num_req", "isl", "osl")}
        self.ticks: list[dict] = []
        self.total_ticks = 0
        self.scaling_events: list[dict] = []
        self.recommended_scaling_events: list[dict] = []
        self._recommended: dict[str, int | None] = {}
        self._last_load_s = 0.0  # both loops count as having run at the start of the replay
        self._last_thr_s = 0.0
        self._thr_floor: dict[str, int] = {}
        self._seen: dict[tuple[int, int], int] = {}
        self._last_isl = 0.0
        self._last_osl = 0.0
        self._hit_rate: float | None = None  # the traffic window's, once the throughput loop has read one
        self._accept = 1.0
        self._started: dict[str, int] = {}  # starting replicas as counts for advisory
        self._observed: list[tuple[float, float, float]] = []  # (count, ISL, OSL) per throughput interval, as fed
        self.policy = POLICIES[self.settings.decision_policy]()

    # -- protocol -------------------------------------------------------------------------
    def initial_tick_ms(self) -> float:
        return self.settings.tick_interval_s * 1000.0

    def needs_traffic(self, now_ms: float) -> bool:
        """Whether this tick's throughput loop is due (the coordinator then closes the traffic window)."""
        s = self.settings
        now_s = now_ms / 1000.0
        return s.enable_throughput_scaling and now_s - self._last_thr_s >= s.throughput_interval_s - EPS

    def warm_up(self, windows: list[tuple[int, float, float]]) -> None:
        """Feed recorded history (request count, mean ISL, mean OSL per throughput interval)."""
        for n, isl, osl in windows:
            self._observe_traffic(n, isl, osl)

    def set_runtime_fields(self, changes: dict) -> None:
        """Change runtime fields from now on (a retune decision): ``load_scaling_down_sensitivity``,
        ``load_min_observations``, ``max_throughput_scaling_replicas`` and the load predictor's
        fields (``load_predictor``, ``load_predictor_log1p``, ``prophet_window_size``,
        ``kalman_*``). A changed predictor is rebuilt and fed the whole history this Planner
        observed (warm-up included), so it forecasts from the same series as the one it replaces."""
        s = self.settings
        self.settings = s.with_knobs(changes)
        if "load_min_observations" in changes:
            for m in self.perf_models.values():
                for store in m.stores.values():
                    store.min_observations = changes["load_min_observations"]
        if self.settings.predictor != s.predictor:
            self.predictors = {k: Predictor(self.settings.predictor, s.throughput_interval_s)
                               for k in ("num_req", "isl", "osl")}
            observed, self._observed = self._observed, []
            self._last_isl = self._last_osl = 0.0
            for n, isl, osl in observed:
                self._observe_traffic(n, isl, osl)

    def on_tick(self, snap: Snapshot) -> Decision:
        s = self.settings
        now_s = snap.now_ms / 1000.0
        load_due = s.enable_load_scaling and now_s - self._last_load_s >= s.load_interval_s - EPS
        thr_due = s.enable_throughput_scaling and now_s - self._last_thr_s >= s.throughput_interval_s - EPS
        diagnostics: dict = {}
        current = {r: snap.roles[r].expected for r in s.roles}
        if s.target == "sla" and (load_due or (thr_due and not s.enable_load_scaling)):
            self._feed_perf_models(snap)
        proposals: dict[str, int] = {}
        if thr_due:
            self._last_thr_s = now_s
            self._throughput(snap, diagnostics)
        if load_due:
            self._last_load_s = now_s
            proposals = self._load(snap, diagnostics)
        targets: dict[str, int | None] = {}
        for role in s.roles:
            cur = current[role]
            want = proposals.get(role)
            floor = self._thr_floor.get(role)
            if s.enable_load_scaling:
                if floor is not None:
                    want = max(want if want is not None else cur, floor)
            elif floor is not None:
                want = floor
            if want is not None:
                want = max(want, s.floor(role))
                if want > cur and snap.roles[role].starting:
                    want = cur  # scale-ups wait while replicas start
                    diagnostics.setdefault("reasons", {})[role] = "scaling_in_progress"
            targets[role] = want
        targets = self._fit_budget(targets, current, diagnostics)
        scale_to = {r: (t if t is not None and t != current[r] else None) for r, t in targets.items()}
        self._record_events(snap, current, scale_to, targets)
        next_tick = snap.now_ms + s.tick_interval_s * 1000.0
        executed = {r: None for r in s.roles} if s.advisory else scale_to
        decision = Decision(executed.get("prefill"), executed.get("decode"), next_tick)
        self.total_ticks += 1
        if self.capture_details:
            self.ticks.append(self._tick_record(snap, load_due, thr_due, scale_to, decision, diagnostics))
        return decision

    # -- observations -----------------------------------------------------------------------
    def _feed_perf_models(self, snap: Snapshot) -> None:
        """Each engine rank's latest record: into its model's averages, and (a pass not sampled
        before) into the store of its pass type; a pure rank pass of a worker whose ranks mix
        prefill and decode is a cross-rank sample."""
        for role, st in snap.roles.items():
            model = self.perf_models.get("agg" if self.settings.mode == "agg" else role)
            if model is None:
                continue
            by_worker: dict[int, list[Fpm]] = {}
            for f in st.fpms:
                by_worker.setdefault(f.worker_id, []).append(f)
            for fpms in by_worker.values():
                passes = [pass_of(f) for f in fpms]
                types = {p.pass_type for p in passes if not p.empty}
                cross = len(fpms) > 1 and (MIXED in types or len(types) > 1)
                for f, p in zip(fpms, passes):
                    key = (f.worker_id, f.dp_rank)
                    new = f.wall_time_s > 0 and f.pass_ordinal != self._seen.get(key)
                    if new:
                        self._seen[key] = f.pass_ordinal
                    store = CROSS_RANK if cross and p.pass_type != MIXED else None
                    model.observe(p, f.wall_time_s * 1000.0, store, sample=new)

    def _observe_traffic(self, n: float, isl: float, osl: float) -> None:
        self._observed.append((n, isl, osl))
        if n == 0 and (self._last_isl or self._last_osl):
            isl, osl = self._last_isl, self._last_osl  # idle window: carry ISL/OSL forward
        self.predictors["num_req"].add(n)
        self.predictors["isl"].add(isl)
        self.predictors["osl"].add(osl)
        if n:
            self._last_isl, self._last_osl = isl, osl

    # -- throughput / SLA sizing -------------------------------------------------------------
    def _throughput(self, snap: Snapshot, diag: dict) -> None:
        s = self.settings
        w = snap.traffic
        if w is None:
            return
        self._observe_traffic(w.num_req, w.avg_isl, w.avg_osl)
        if w.num_req:
            self._hit_rate = w.avg_kv_hit_rate
            self._accept = max(1.0, w.avg_accept_length)
        need = {"prefill": PURE_PREFILL, "decode": PURE_DECODE, "agg": MIXED}
        n_hat = self.predictors["num_req"].predict()
        isl_hat = self.predictors["isl"].predict()
        osl_hat = self.predictors["osl"].predict()
        demand = n_hat / s.throughput_interval_s
        info = {"predicted_num_req": n_hat, "predicted_isl": isl_hat, "predicted_osl": osl_hat, "demand_rps": demand}
        roles = ("prefill", "decode") if s.mode == "disagg" else ("agg",)
        models = {r: self.perf_models.get(r) for r in roles}
        if any(m is None or not m.ready(need[r]) for r, m in models.items()):
            info["reason"] = "partner_not_ready" if s.mode == "disagg" else "insufficient_data"
            diag["throughput"] = info
            return
        if isl_hat <= 0 or osl_hat <= 0:
            info["reason"] = "no_traffic"
            diag["throughput"] = info
            return
        for r, m in models.items():
            rps, ok = m.capacity_rps(isl_hat, osl_hat, self._hit_rate or 0.0, s.ttft_ms, s.itl_ms, self._accept)
            role = "decode" if r == "agg" else r
            info[f"{role}_capacity_rps"] = rps
            if not ok:
                info[f"{role}_sla_unreachable"] = True
            want = math.ceil(demand / rps) if rps > 0 else s.floor(role)
            cur = snap.roles[role].expected
            cap = s.max_throughput_scaling_replicas
            want = min(max(want, cur - cap), cur + cap)
            self._thr_floor[role] = max(want, s.floor(role))
        info["targets"] = dict(self._thr_floor)
        diag["throughput"] = info

    # -- load-based scaling ------------------------------------------------------------------
    def _gate(self, st: RoleState, ready_ids: set) -> str | None:
        """The load loop holds while workers start, without records, or when the records do
        not cover exactly the ready workers."""
        if st.starting:
            return "scaling_in_progress"
        if not st.fpms:
            return "no_fpm_data"
        if {f.worker_id for f in st.fpms} != ready_ids:
            return "worker_count_mismatch"
        return None

    def _load(self, snap: Snapshot, diag: dict) -> dict[str, int]:
        s = self.settings
        out: dict[str, int] = {}
        reasons = diag.setdefault("reasons", {})
        if s.target == "sla":
            return self._load_sla(snap, diag)
        for role in s.roles:
            st = snap.roles[role]
            n = len(st.active)
            gate = self._gate(st, set(st.active))
            if gate is not None:
                reasons[role] = gate
                continue
            signals = [self._signal(role, f, st.caps) for f in st.fpms]
            up, down = self._thresholds(role)
            strict_up = s.target == "throughput" and role == "decode" or s.target == "latency" and role == "decode"
            if any((sig > up) if strict_up else (sig >= up) for sig in signals):
                out[role], reasons[role] = n + 1, "scale_up"
            elif (n > 1 or st.starting) and all(self._below(role, sig, down) for sig in signals):
                desired = max(n - 1, s.floor(role))
                if 0 < desired < n and max(signals) * n / desired >= up:
                    reasons[role] = "scale_down_refused_consolidation"  # would overload the rest
                else:
                    out[role], reasons[role] = desired, "scale_down"
            else:
                reasons[role] = "no_change"
        diag["load_signals"] = {role: [self._signal(role, f, snap.roles[role].caps) for f in snap.roles[role].fpms]
                                for role in s.roles}
        return out

    def _below(self, role: str, sig: float, down: float) -> bool:
        s = self.settings
        if s.target == "load" or (s.target == "latency" and role == "prefill"):
            return sig <= down
        return sig < down

    def _thresholds(self, role: str) -> tuple[float, float]:
        s = self.settings
        if s.target == "load":
            if role == "prefill":
                return float(s.prefill_scale_up_queue_tokens), float(s.prefill_scale_down_queue_tokens)
            return s.decode_scale_up_kv_rate / 100.0, s.decode_scale_down_kv_rate / 100.0
        pu, pd, du, dd = _THRESHOLDS[s.target]
        return (pu, pd) if role == "prefill" else (du, dd)

    def _signal(self, role: str, f: Fpm, caps: Capabilities) -> float:
        if role == "prefill":
            if self.settings.target == "load":
                return float(f.queued_prefill_tokens)
            return f.queued_prefill_tokens / max(1, caps.context_length)
        kv = f.decode_kv_tokens + f.queued_decode_kv_tokens
        if self.settings.mode == "agg":
            kv += f.queued_prefill_tokens
        return kv / max(1, caps.max_kv_tokens)

    def _load_sla(self, snap: Snapshot, diag: dict) -> dict[str, int]:
        """SLA target: the decision policy proposes each role's count from the perf model's
        estimates (after the common gates)."""
        s = self.settings
        reasons = diag.setdefault("reasons", {})
        engines_diag: dict[str, list] = {}
        out: dict[str, int] = {}
        ctx = PolicyContext(s, self._hit_rate, self._accept)
        for role in s.roles:
            st = snap.roles[role]
            model = self.perf_models.get("agg" if s.mode == "agg" else role)
            gate = self._gate(st, set(st.active))
            if gate is None and model is None:
                gate = "insufficient_data"
            if gate is not None:
                reasons[role] = gate
                continue
            target, reasons[role], engines_diag[role] = self.policy.propose(role, st, model, ctx)
            if target is not None:
                out[role] = target
        diag["engines"] = engines_diag
        diag["perf_models"] = {k: m.describe() for k, m in self.perf_models.items()}
        return out

    # -- GPU budget -----------------------------------------------------------------------------
    def _fit_budget(self, targets: dict[str, int | None], current: dict[str, int], diag: dict) -> dict[str, int | None]:
        s = self.settings
        hi, lo = s.max_gpu_budget, s.min_gpu_budget
        want = {r: (t if t is not None else current[r]) for r, t in targets.items()}
        gpus = {r: s.gpus(r) for r in want}

        def total(x: dict[str, int]) -> int:
            return sum(x[r] * gpus[r] for r in x)

        cur_total = total(current)
        if (hi >= 0 and cur_total > hi) or (lo >= 0 and cur_total < lo):
            # the current allocation is out of the band: reconcile it from the current counts
            fitted = self._clamp_down(dict(current), hi, gpus) if hi >= 0 and cur_total > hi else \
                self._clamp_up(dict(current), lo, gpus)
            out = {r: (fitted[r] if fitted[r] != current[r] else targets[r]) for r in want}
            diag.setdefault("budget", {}).update({"max_gpu_budget": hi, "min_gpu_budget": lo, "proposed": want,
                                                  "fitted": dict(out), "reason": "gpu_budget_reconcile"})
            return out
        fitted = dict(want)
        if hi >= 0 and total(fitted) > hi:
            fitted = self._clamp_down(fitted, hi, gpus)
        if lo >= 0 and total(fitted) < lo:
            fitted = self._clamp_up(fitted, lo, gpus)
        out = dict(targets)
        held = False
        for r in want:
            if fitted[r] == want[r]:
                continue
            # a clamp may suppress or shrink a move but never reverse or amplify it
            d_want = want[r] - current[r]
            d_fit = fitted[r] - current[r]
            if d_want * d_fit < 0 or abs(d_fit) > abs(d_want) or (d_want == 0 and d_fit != 0):
                fitted[r] = current[r]
                held = True
            out[r] = fitted[r]
        if held and hi >= 0 and total(fitted) > hi and total(fitted) > total(current):
            out = {r: current[r] for r in want}
        if held or out != targets:
            diag.setdefault("budget", {}).update(
                {"max_gpu_budget": hi, "min_gpu_budget": lo, "proposed": want, "fitted": dict(out),
                 "reason": "gpu_budget_guard_hold" if held else "gpu_budget_clamp"})
        return out

    def _clamp_down(self, want: dict[str, int], hi: int, gpus: dict[str, int]) -> dict[str, int]:
        s = self.settings
        if len(want) == 1:
            (r,) = want
            return {r: max(s.floor(r), hi // gpus[r])}
        p, d = want["prefill"], want["decode"]
        gp, gd = gpus["prefill"], gpus["decode"]
        min_p, min_d = s.floor("prefill"), s.floor("decode")
        if min_p * gp + min_d * gd > hi:
            return {"prefill": 0, "decode": 0}
        scale = hi / (p * gp + d * gd)
        p2 = max(min_p, min(int(p * scale), (hi - min_d * gd) // gp))
        d2 = max(min_d, (hi - p2 * gp) // gd)
        return {"prefill": p2, "decode": d2}

    def _clamp_up(self, want: dict[str, int], lo: int, gpus: dict[str, int]) -> dict[str, int]:
        s = self.settings
        if len(want) == 1:
            (r,) = want
            return {r: max(s.floor(r), -(-lo // gpus[r]))}
        p, d = want["prefill"], want["decode"]
        gp, gd = gpus["prefill"], gpus["decode"]
        have = p * gp + d * gd
        if have <= 0:
            p2 = -(-(lo // 2) // gp)
            return {"prefill": p2, "decode": max(d, -(-(lo - p2 * gp) // gd))}
        scale = lo / have
        p2 = max(p, math.ceil(p * scale))
        d2 = max(d, -(-(lo - p2 * gp) // gd))
        return {"prefill": p2, "decode": d2}

    # -- records --------------------------------------------------------------------------------
    def _record_events(self, snap: Snapshot, current: dict, scale_to: dict, targets: dict) -> None:
        s = self.settings
        at_s = snap.now_ms / 1000.0
        for role in s.roles:
            comp = "agg" if s.mode == "agg" else role
            to = scale_to.get(role)
            if s.advisory:
                rec = targets.get(role)
                if rec is None or rec == current[role]:
                    self._recommended[role] = None  # a hold resets the recommendation
                elif rec != self._recommended.get(role):
                    self._recommended[role] = rec
                    self.recommended_scaling_events.append(
                        {"at_s": at_s, "component": comp, "from_count": current[role], "to_count": rec,
                         "reason": "scale_up" if rec > current[role] else "scale_down"})
            elif to is not None:
                self.scaling_events.append({"at_s": at_s, "component": comp, "from_count": current[role], "to_count": to,
                                            "reason": "scale_up" if to > current[role] else "scale_down"})

    def _tick_record(self, snap: Snapshot, load_due: bool, thr_due: bool, scale_to: dict, decision: Decision,
                     diag: dict) -> dict:
        s = self.settings
        roles = snap.roles
        counts = {}
        for role in ("prefill", "decode"):
            st = roles.get(role)
            counts[f"ready_{role}"] = len(st.active) if st else 0
            counts[f"expected_{role}"] = st.expected if st else 0
            counts[f"{role}_scaling_in_progress"] = bool(st.starting) if st else False
        return {
            "ordinal": self.total_ticks,
            "at_ms": snap.now_ms,
            "scheduled_tick": {
                "at_s": snap.now_ms / 1000.0,
                "run_load_scaling": load_due,
                "run_throughput_scaling": thr_due,
                "need_worker_states": True,
                "need_worker_fpm": load_due or s.target == "sla",
                "need_traffic_metrics": thr_due,
                "traffic_metrics_duration_s": s.throughput_interval_s if thr_due else None,
            },
            "input": {
                "now_s": snap.now_ms / 1000.0,
                "traffic": snap.traffic.as_dict() if snap.traffic is not None else None,
                "worker_counts": counts,
                "fpm_observations": {r: [f.as_dict() for f in roles[r].fpms] if r in roles else [] for r in ("prefill", "decode")},
            },
            "topology": {r: (roles[r].topology() if r in roles else None) for r in ("prefill", "decode")},
            "effects": {"scale_to": ({"prefill": scale_to.get("prefill"), "decode": scale_to.get("decode")}
                                     if any(v is not None for v in scale_to.values()) else None),
                        "next_tick": decision.next_tick_ms, "diagnostics": diag},
            "runtime_decision": {"target_prefill": decision.target_prefill, "target_decode": decision.target_decode,
                                 "next_tick_ms": decision.next_tick_ms, "router_parameters": None},
        }

