"""Pydantic v2 models of the ``predict`` YAML (reference section and key names).

Every section is strict (``extra="forbid"``) and frozen once validated. Keys of reference
features this build does not model yet are accepted by the schema so they validate like the
reference, then rejected with "not supported" by ``simulator.config.rules``.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator
from pydantic import Strict as StrictType


def _plain_int(v):
    """Integral numbers of other types (numpy) as int; anything else is left to the strict check."""
    return int(v) if isinstance(v, Integral) and not isinstance(v, (bool, int)) else v


def _plain_float(v):
    """Real numbers of other types (numpy, Fraction) as float; anything else is left to the strict check."""
    return float(v) if isinstance(v, Real) and not isinstance(v, (bool, int, float)) else v


# Every number field of the config models (here, in engine_args and in planner_config) uses these
# types, never a bare int or float: a bool (``replicas: true``), a string (``"4"``) and, for an
# integer, a float (``4.0``) are rejected instead of being taken as 1 / 4; a float field takes an
# integer (``ttft_ms: 500``). tests/simulator/config/test_number_types.py checks every field.
Int = Annotated[int, StrictType(), BeforeValidator(_plain_int)]
Float = Annotated[float, StrictType(), BeforeValidator(_plain_float)]
PosInt = Annotated[Int, Field(gt=0)]
NonNegInt = Annotated[Int, Field(ge=0)]
PosFloat = Annotated[Float, Field(gt=0, allow_inf_nan=False)]
NonNegFloat = Annotated[Float, Field(ge=0, allow_inf_nan=False)]
Fraction01 = Annotated[Float, Field(gt=0, le=1)]  # (0, 1]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


# -- traffic ---------------------------------------------------------------------------
class SyntheticSource(Strict):
    type: Literal["synthetic"]
    input_tokens: PosInt = 1024
    output_tokens: NonNegInt = 128
    cached_prefix_tokens: NonNegInt = 0

    @model_validator(mode="after")
    def _prefix_fits(self):
        if self.cached_prefix_tokens > self.input_tokens:
            raise ValueError("cached_prefix_tokens must be <= input_tokens")
        return self


class SessionShape(Strict):
    turns: Annotated[Int, Field(ge=2)] = 4


class SyntheticSessionSource(Strict):
    type: Literal["synthetic-session"]
    new_input_tokens_per_turn: PosInt = 1024
    output_tokens_per_turn: PosInt = 128
    session: SessionShape = SessionShape()
    shared_prefix_ratio: Annotated[Float, Field(ge=0, le=1)] = 0.0
    prefix_groups: NonNegInt = 0
    inter_turn_delay_ms: NonNegFloat = 0.0

    @model_validator(mode="after")
    def _groups(self):
        if self.shared_prefix_ratio > 0 and self.prefix_groups <= 0:
            raise ValueError("prefix_groups must be > 0 when shared_prefix_ratio > 0")
        return self


TraceFormat = Literal["mooncake", "mooncake-delta", "dynamo", "agentic_mooncake", "applied_compute_agentic", "weka"]


class TraceSource(Strict):
    type: Literal["trace"]
    paths: list[str] = Field(min_length=1)
    format: TraceFormat = "mooncake"
    block_size: PosInt = 512

    @field_validator("paths", mode="before")
    @classmethod
    def _one_path(cls, v):
        return [v] if isinstance(v, str) else v


Source = Annotated[SyntheticSource | SyntheticSessionSource | TraceSource, Field(discriminator="type")]


class ConcurrencyLoad(Strict):
    type: Literal["concurrency"]
    concurrency: PosInt = 10


class _RateLoad(Strict):
    requests_per_second: PosFloat | None = None
    sessions_per_second: PosFloat | None = None

    @model_validator(mode="after")
    def _one_rate(self):
        if (self.requests_per_second is None) == (self.sessions_per_second is None):
            raise ValueError("set exactly one of requests_per_second or sessions_per_second")
        return self

    @property
    def rate(self) -> float:
        return self.requests_per_second if self.requests_per_second is not None else self.sessions_per_second


class PoissonLoad(_RateLoad):
    type: Literal["poisson"]
    seed: Int = 42


class ConstantRateLoad(_RateLoad):
    type: Literal["constant_rate"]


class TraceTimestampsLoad(Strict):
    type: Literal["trace_timestamps"]
    speedup: PosFloat = 1.0


class KvCapacityFractionLoad(Strict):
    type: Literal["kv_capacity_fraction"]
    fraction: PosFloat


Load = Annotated[
    ConcurrencyLoad | PoissonLoad | ConstantRateLoad | TraceTimestampsLoad | KvCapacityFractionLoad,
    Field(discriminator="type"),
]


class Stop(Strict):
    requests: PosInt | None = None
    requests_per_load_unit: PosFloat | None = None
    sessions: PosInt | None = None
    sessions_per_load_unit: PosFloat | None = None
    max_virtual_time_seconds: PosFloat | None = None


class Traffic(Strict):
    source: Source = SyntheticSource(type="synthetic")
    load: Load = ConcurrencyLoad(type="concurrency")
    stop: Stop = Stop()


DEFAULT_TRAFFIC = Traffic(stop=Stop(requests=100))


# -- engine ---------------------------------------------------------------------------
class Parallelism(Strict):
    replicas: PosInt = 1
    tensor: PosInt = 1
    pipeline: PosInt = 1
    attention_data: PosInt = 1
    moe_tensor: PosInt = 1
    moe_expert: PosInt = 1
    prefill_context: PosInt = 1
    decode_context: PosInt = 1


class SGLangScheduler(Strict):
    """aisim extension (``scheduler.sglang``): SGLang's own scheduler settings, the engine's defaults."""

    schedule_policy: Literal["fifo", "lpm"] = "fifo"
    max_prefill_tokens: PosInt = 16384
    chunked_prefill_size: PosInt = 8192  # per worker; attention-data ranks split it
    clip_max_new_tokens: PosInt = 4096
    schedule_conservativeness: Annotated[Float, Field(gt=0)] = 1.0


class TrtllmScheduler(Strict):
    """aisim extension (``scheduler.trtllm``): TensorRT-LLM's capacity scheduler (its one policy)."""

    capacity_scheduler_policy: Literal["guaranteed_no_evict"] = "guaranteed_no_evict"


class Scheduler(Strict):
    max_batched_tokens: PosInt = 8192
    max_sequences: PosInt | None = None  # 256 (aggregated, decode) / 1 (prefill)
    prefill_schedule_interval: PosInt = 1
    prefill_decode_interval: NonNegInt = 0
    preemption_mode: Literal["lifo", "fifo"] = "lifo"  # aisim: which running request a full cache preempts
    sglang: SGLangScheduler | None = None  # aisim: backend sglang only
    trtllm: TrtllmScheduler | None = None  # aisim: backend trtllm only


class Capacity(Strict):
    type: Literal["default", "fixed"] = "default"
    memory_fraction: Fraction01 | None = None
    blocks: PosInt | None = None
    bytes: PosInt | None = None
    cuda_graph_reserved_bytes: NonNegInt = 0

    @model_validator(mode="after")
    def _fixed(self):
        if self.type == "fixed":
            if (self.blocks is None) == (self.bytes is None):
                raise ValueError("type fixed needs exactly one of blocks or bytes")
            if self.memory_fraction is not None or self.cuda_graph_reserved_bytes:
                raise ValueError("memory_fraction and cuda_graph_reserved_bytes are only allowed with type default")
        elif self.blocks is not None or self.bytes is not None:
            raise ValueError("blocks and bytes are only allowed with type fixed")
        return self


class HostOffload(Strict):
    """``kv_cache.host_offload``: a host-memory (G2) KV tier (docs/kv-offload.md)."""

    scope: Literal["dp_rank_local", "cluster_shared"] = "dp_rank_local"
    num_host_blocks: PosInt  # per attention-data rank (dp_rank_local) or the pool's total (cluster_shared)
    d2h_bandwidth_gbps: NonNegFloat = 32.0  # this rank's G1 -> G2 link; 0: instantaneous
    h2d_bandwidth_gbps: NonNegFloat = 32.0  # this rank's G2 -> G1 link
    shared_d2h_bandwidth_gbps: NonNegFloat = 80.0  # a cluster_shared pool's aggregate write cap
    shared_h2d_bandwidth_gbps: NonNegFloat = 80.0  # its aggregate read cap
    latency_to_first_byte_ms: NonNegFloat = 0.0

    @model_validator(mode="before")
    @classmethod
    def _scope(cls, data):
        if isinstance(data, dict) and data.get("scope") == "worker_local":
            raise ValueError("host_offload.scope `worker_local` is a G3 scope; use `dp_rank_local` for per-DP-rank "
                             "G2 caches")
        return data


class G3Offload(Strict):
    """``kv_cache.g3_offload``: a disk / remote-storage (G3) tier behind the host tier."""

    scope: Literal["worker_local", "cluster_shared"]
    num_g3_blocks: PosInt  # per worker (worker_local) or the store's total (cluster_shared)
    latency_to_first_byte_ms: NonNegFloat = 0.1
    read_bandwidth_gbps: NonNegFloat = 10.0  # per worker, each direction
    write_bandwidth_gbps: NonNegFloat = 10.0
    shared_read_bandwidth_gbps: NonNegFloat = 80.0  # store-wide caps (cluster_shared)
    shared_write_bandwidth_gbps: NonNegFloat = 80.0


class KvCache(Strict):
    block_size: PosInt | None = None  # vLLM 64, SGLang 1, TRT-LLM 32
    prefix_caching: bool = True
    bytes_per_token: Literal["auto"] | PosInt = "auto"
    capacity: Capacity = Capacity()
    host_offload: HostOffload | None = None
    g3_offload: G3Offload | None = None


class Timing(Strict):
    type: Literal["default", "fixed", "polynomial", "roofline"] = "default"
    prefill_ms: NonNegFloat | None = None
    decode_ms: NonNegFloat | None = None
    forward_model: Literal["op_level", "fpm"] = "op_level"
    # roofline efficiency factors (aisim addition; only with type roofline)
    compute_efficiency: Fraction01 | None = None
    memory_efficiency: Fraction01 | None = None
    overhead_ms: NonNegFloat | None = None

    @model_validator(mode="after")
    def _fields(self):
        fixed_given = self.prefill_ms is not None or self.decode_ms is not None
        if self.type == "fixed":
            if self.prefill_ms is None or self.decode_ms is None:
                raise ValueError("type fixed needs both prefill_ms and decode_ms")
        elif fixed_given:
            raise ValueError("prefill_ms and decode_ms are only allowed with type fixed")
        roof = (self.compute_efficiency, self.memory_efficiency, self.overhead_ms)
        if self.type != "roofline" and any(v is not None for v in roof):
            raise ValueError("compute_efficiency, memory_efficiency and overhead_ms are only allowed with type roofline")
        return self


class Worker(Strict):
    hardware: str | None = None
    startup_seconds: NonNegFloat = 0.0
    # aisim: this role's own context length (max: the model's; null: no limit); engine: engine.context_length
    context_length: Literal["engine", "max"] | PosInt | None = "engine"
    # aisim: every pass takes 1 / speedup_ratio of the timing model's time, decode passes a further
    # 1 / decode_speedup_ratio (what-if a faster kernel or GPU; any timing type)
    speedup_ratio: PosFloat = 1.0
    decode_speedup_ratio: PosFloat = 1.0
    parallelism: Parallelism = Parallelism()
    scheduler: Scheduler = Scheduler()
    kv_cache: KvCache = KvCache()
    timing: Timing = Timing()


class KvTransfer(Strict):
    bandwidth_gb_per_second: PosFloat | None = None
    bytes_per_token: Literal["auto"] | PosInt = "auto"
    timing_mode: Literal["destination_missing", "full_prompt"] = "destination_missing"


class Tokenization(Strict):
    workers: PosInt = 1
    base_ms: NonNegFloat = 0.0
    per_input_token_us: NonNegFloat = 0.0


class Speculation(Strict):
    """n-gram (prompt lookup) speculative decoding (docs/speculative-decoding.md)."""

    kind: Literal["ngram"]
    num_speculative_tokens: PosInt
    acceptance_rates: list[Float]  # P(draft t accepted | drafts before it accepted), t = 1..num_speculative_tokens
    seed: Int | None = None  # the requests' acceptance streams (default: execution.seed)


class Engine(Strict):
    mode: Literal["aggregated", "disaggregated", "afd"] = "aggregated"
    # model and hardware: required wherever a rule needs them (measured or roofline timing, KV
    # capacity from GPU memory; plan building says which); polynomial or fixed timing with a fixed
    # KV capacity replays without either
    model: str | None = None
    hardware: str | None = None
    backend: Literal["vllm", "sglang", "trtllm"] = "vllm"
    backend_version: str | None = None
    context_length: Literal["max"] | PosInt | None = "max"  # max: the model's; null: no limit
    workers: dict[Literal["aggregated", "prefill", "decode", "encoder"], Worker]
    kv_transfer: KvTransfer | None = None
    enable_chunked_prefill: bool = True
    speculation: Speculation | None = None
    nextn: NonNegInt = 0  # MTP draft tokens a decode pass verifies (0: off)
    nextn_accepted: Float | None = None  # mean accepted draft tokens per pass (the reference's scalar)
    tokenization: Tokenization | None = None

    @model_validator(mode="after")
    def _roles(self):
        roles = set(self.workers)
        if self.mode == "aggregated":
            if roles != {"aggregated"}:
                raise ValueError("mode aggregated needs exactly workers.aggregated")
            if self.kv_transfer is not None:
                raise ValueError("kv_transfer is only allowed with mode disaggregated")
        elif self.mode == "disaggregated":
            if "aggregated" in roles or not {"prefill", "decode"} <= roles:
                raise ValueError("mode disaggregated needs workers.prefill and workers.decode (and no workers.aggregated)")
        for role, w in self.workers.items():
            if role == "aggregated" and w.hardware is not None:
                raise ValueError("workers.aggregated.hardware is not allowed; only prefill/decode roles may override hardware")
        if not self.enable_chunked_prefill and self.backend == "sglang":
            raise ValueError("enable_chunked_prefill: false is not allowed with backend sglang")
        return self


# -- router ----------------------------------------------------------------------------
class PrefillLoadModel(Strict):
    type: Literal["none", "aic"] = "none"


# Router knobs the reference accepts but replay does not model: (reason, fix)
ROUTER_RESERVED = {
    "shared_cache_multiplier": "no shared (cross-worker) KV cache is simulated",
    "active_decode_blocks_threshold": "router admission control (busy filtering) is not modelled",
    "active_prefill_tokens_threshold": "router admission control (busy filtering) is not modelled",
    "active_prefill_tokens_threshold_frac": "router admission control (busy filtering) is not modelled",
    "router_queue_threshold": "the router-side request queue is not modelled",
    "router_queue_policy": "the router-side request queue is not modelled",
}


class Router(Strict):
    policy: Literal["round_robin", "random", "kv_router"] = "round_robin"
    prefill_load_model: PrefillLoadModel = PrefillLoadModel()
    overlap_score_credit: Annotated[Float, Field(ge=0, le=1)] | None = None  # 1.0 with kv_router
    prefill_load_scale: NonNegFloat | None = None  # 1.0 with kv_router
    temperature: NonNegFloat | None = None  # 0.0 with kv_router
    host_cache_hit_weight: NonNegFloat | None = None  # 0.75 (Dynamo's) with kv_router and a host tier
    disk_cache_hit_weight: NonNegFloat | None = None  # 0.25 with kv_router and a disk tier
    shared_cache_multiplier: NonNegFloat | None = None
    active_decode_blocks_threshold: NonNegFloat | None = None
    active_prefill_tokens_threshold: NonNegInt | None = None
    active_prefill_tokens_threshold_frac: NonNegFloat | None = None
    router_queue_threshold: NonNegFloat | None = None
    router_queue_policy: Literal["fcfs", "lcfs", "wspt"] | None = None

    @model_validator(mode="after")
    def _kv_only(self):
        if self.policy != "kv_router":
            for k in ("overlap_score_credit", "prefill_load_scale", "temperature"):
                if getattr(self, k) is not None:
                    raise ValueError(f"{k} is only allowed with policy kv_router")
            if self.prefill_load_model.type != "none":
                raise ValueError("prefill_load_model.type aic is only allowed with policy kv_router")
        return self


# -- evaluation ------------------------------------------------------------------------
SLA_PERCENTILES = (50, 75, 90, 95, 99)  # the summary's percentiles (simulator.metrics.stats)


def _sla_percentile(v: Any) -> Any:
    if v == "mean" or v is None:
        return "mean"
    if isinstance(v, bool) or not isinstance(v, int) or v not in SLA_PERCENTILES:
        raise ValueError(f"must be mean or one of {', '.join(map(str, SLA_PERCENTILES))} (the summary's "
                         f"percentiles), got {v!r}")
    return v


SlaPercentile = Annotated[Literal["mean"] | Int, BeforeValidator(_sla_percentile)]


class Sla(Strict):
    ttft_ms: PosFloat | None = None
    itl_ms: PosFloat | None = None
    e2e_ms: PosFloat | None = None
    # aisim: the statistic the limits bound (docs: README "SLA"); mean (default) keeps the
    # reference's per-request goodput; P: the deployment meets the SLA when the P-th percentile of
    # every limited metric is within its limit, and goodput counts its completed requests then, 0 else
    percentile: SlaPercentile = "mean"

    @model_validator(mode="after")
    def _exclusive(self):
        if self.e2e_ms is not None and (self.ttft_ms is not None or self.itl_ms is not None):
            raise ValueError("e2e_ms is mutually exclusive with ttft_ms/itl_ms")
        return self

    @property
    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.itl_ms, self.e2e_ms))


class Evaluation(Strict):
    sla: Sla = Sla()


# -- execution -------------------------------------------------------------------------
class Resources(Strict):
    initialization_timeout_seconds: PosFloat = 60.0
    shutdown_timeout_seconds: PosFloat = 5.0
    memory_limit_gb: Literal["auto"] | PosFloat = "auto"
    cpu_limit: Literal["auto"] | PosInt = "auto"
    reserve_memory_gb: NonNegFloat = 1.0
    reserve_memory_fraction: Annotated[Float, Field(ge=0, lt=1)] = 0.0
    available_memory_fraction: Fraction01 = 0.9


class Execution(Strict):
    resources: Resources = Resources()
    seed: Int = 42  # aisim: root of every actor's random stream (the random and KV routers)
    # aisim: where the actors live and how they synchronise (see README, "Running on Ray")
    backend: Literal["local", "ray"] = "local"
    router_sync_ms: NonNegFloat = 0.0  # 0: exact lockstep; W: the router sees worker state up to W ms old
    engine_actors: Literal["auto"] | PosInt = "auto"  # Ray actors hosting the engine workers
    driver_hosts_workers: bool = True  # on Ray the driver steps a share of the workers too, while the actors step theirs
    ray_address: str | None = None  # None: start a local Ray; "auto" or HOST:PORT: join a running cluster

    @model_validator(mode="after")
    def _ray_address_needs_ray(self):
        if self.ray_address is not None and self.backend != "ray":
            raise ValueError("ray_address needs backend: ray (or the --backend ray flag)")
        return self


# -- planner ---------------------------------------------------------------------------
class PlannerKnobs(Strict):
    """The Planner knobs that the YAML ``planner`` section and the API PlannerConfig share,
    under the same names."""
    max_throughput_scaling_replicas: PosInt = 8
    max_num_fpm_samples: PosInt = 64
    fpm_sample_bucket_size: PosInt = 16
    load_scaling_down_sensitivity: Annotated[Int, Field(ge=0, le=100)] = 80
    load_min_observations: NonNegInt = 5
    load_predictor: Literal["constant", "arima", "prophet", "kalman"] = "arima"
    load_predictor_log1p: bool = False
    prophet_window_size: PosInt = 50
    kalman_q_level: NonNegFloat = 1.0
    kalman_q_trend: NonNegFloat = 0.1
    kalman_r: PosFloat = 10.0
    kalman_min_points: PosInt = 5
    load_predictor_warmup_trace: str | None = None
    advisory: bool = False
    # target load's thresholds (queued prefill tokens; decode KV use in percent); in a predict
    # config None takes the reference's fixed values (1/0 and 90/70)
    prefill_scale_up_queue_tokens: Annotated[Float, Field(ge=0)] | None = None
    prefill_scale_down_queue_tokens: Annotated[Float, Field(ge=0)] | None = None
    decode_scale_up_kv_rate: Annotated[Float, Field(ge=0, le=100)] | None = None
    decode_scale_down_kv_rate: Annotated[Float, Field(ge=0, le=100)] | None = None
    # GPUs the Planner counts per replica; None: tensor x attention_data of the role (docs/architecture.md)
    prefill_engine_num_gpu: PosInt | None = None
    decode_engine_num_gpu: PosInt | None = None

    @field_validator("fpm_sample_bucket_size")
    @classmethod
    def _square(cls, v: int) -> int:
        r = math.isqrt(v)
        if r * r != v:
            raise ValueError("fpm_sample_bucket_size must be a perfect square")
        return v

    @model_validator(mode="after")
    def _thresholds(self):
        for lo, hi in (("prefill_scale_down_queue_tokens", "prefill_scale_up_queue_tokens"),
                       ("decode_scale_down_kv_rate", "decode_scale_up_kv_rate")):
            a, b = getattr(self, lo), getattr(self, hi)
            if a is not None and b is not None and not b > a:
                raise ValueError(f"{hi} must be greater than {lo}")
        return self


def _retune_section(v):
    """``planner.retune`` as a ``RetuneConfig`` (its errors keep their location under planner.retune)."""
    if v is None:
        return None
    from aisim.simulator.config.retune import RetuneConfig  # (retune.py builds on this module's number types)

    return RetuneConfig.model_validate(v)


class Planner(PlannerKnobs):
    policy: Literal["enabled", "disabled"] = "disabled"
    target: Literal["throughput", "latency", "load", "sla"] = "throughput"
    enable_throughput_scaling: bool | None = None
    enable_load_scaling: bool | None = None
    throughput_adjustment_interval_seconds: PosInt | None = None
    load_adjustment_interval_seconds: PosFloat | None = None
    max_num_gpus: Int = 8
    min_num_gpus: Int = -1  # aisim: GPU floor (min_gpu_budget; negative: none), a Spica candidate's live policy
    min_workers: NonNegInt = 1
    prefill_min_workers: PosInt | None = None
    decode_min_workers: PosInt | None = None
    # aisim: the Planner's own latency targets (target sla); None: evaluation.sla's
    ttft_ms: PosFloat | None = None
    itl_ms: PosFloat | None = None
    scale_interval_seconds: PosFloat | None = None  # aisim: the tick; None: the intervals' millisecond GCD
    retune: Annotated[Any, BeforeValidator(_retune_section)] = None  # a RetuneConfig (simulator.config.retune)

    @field_validator("retune")
    @classmethod
    def _retune_needs_policy(cls, v, info):
        if v is not None and info.data.get("policy") == "disabled":
            raise ValueError("retune re-tunes a running Planner and needs policy: enabled; set planner.policy: enabled "
                             "(planner.enable_load_scaling and enable_throughput_scaling false: retune-only mode, "
                             "fixed replicas) or remove planner.retune")
        return v

    @model_validator(mode="after")
    def _advisory(self):
        if self.policy == "disabled" and self.advisory:
            raise ValueError("advisory: true needs policy: enabled")
        return self


# -- top level -------------------------------------------------------------------------
class PredictConfig(Strict):
    traffic: Traffic = DEFAULT_TRAFFIC
    engine: Engine
    evaluation: Evaluation = Evaluation()
    execution: Execution = Execution()
    router: Router = Router()
    planner: Planner = Planner()
