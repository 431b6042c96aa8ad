"""Streaming per-request metrics: compact columns, optional full records.

Per request only scalars are kept (``array`` columns, 8 bytes a value); token gaps are kept
by the workers' ``GapSink`` as pooled (value, weight) pairs. Full per-request records (dicts)
exist only when per-request capture is on.
"""

from __future__ import annotations

from array import array

import numpy as np

from aisim.actors.engine.request import COMPLETED, REJECT_UNKNOWN, REJECTED, Request
from aisim.simulator.metrics.csv_out import row_of
from aisim.simulator.metrics.records import RecordSpool
from aisim.simulator.spill import ColumnFile

NAN = float("nan")
_DTYPES = {"i": np.int64, "b": np.int8, "d": np.float64}

STATUS_COMPLETED = 0
STATUS_REJECTED = 1
STATUS_INCOMPLETE = 2
STATUS_LABELS = ("completed", "rejected", "incomplete")


def _f(x: float | None) -> float:
    return NAN if x is None else x


def _itl(req: Request) -> float | None:
    """The request's mean inter-token gap over its emitted tokens (None below two)."""
    n, first, last = req.num_generated, req.first_token_ms, req.last_token_ms
    return (last - first) / (n - 1) if n >= 2 and first is not None and last is not None else None


def _decode_worker(req: Request) -> int | None:
    """The worker that decoded the request (its decode worker when disaggregated)."""
    h = req.handoff
    return (h.get("decode_worker") if h else req.worker) if req.worker >= 0 else None


def _overlap(routing: list[dict], pool: str):
    for e in routing:
        if e["pool"] == pool:
            return e["reported_overlap_tokens"]
    return None


#: rows the log holds in memory; each further block of rows goes to scratch files (tests lower it)
SPILL_ROWS = 1 << 18
_COLUMNS = ("index", "status", "arrival", "first_token", "second_token", "last_token", "terminal", "input_len",
            "output_len", "requested", "reused", "first_reused", "host_reused", "activated")


class RequestLog:
    """Terminal (or final) state of every offered request, in the order they ended.

    About 81 bytes a request; past ``SPILL_ROWS`` rows each block of rows is written to one
    scratch file per column (``aisim.simulator.spill``), so a ten-million-request replay holds
    one block, and ``column`` reads one column back whole when the summary asks for it."""

    def __init__(self, capture: bool = False, uuid_of=None, rows: bool = False) -> None:
        self.capture = capture
        self.uuid_of = uuid_of
        # (counts and indices in 4 bytes: a production trace's log is its largest per-request state)
        self.index = array("i")
        self.status = array("b")
        self.arrival = array("d")
        self.first_token = array("d")
        self.second_token = array("d")
        self.last_token = array("d")
        self.terminal = array("d")
        self.input_len = array("i")
        self.output_len = array("i")
        self.requested = array("i")
        self.reused = array("i")
        self.first_reused = array("i")
        self.host_reused = array("i")  # first admission's prompt tokens onboarded from host/disk tiers
        self.activated = array("d")  # disaggregated: KV arrived on the decode worker (NaN otherwise)
        # (as they end; ``rows``: kept as request_metrics.csv rows instead of JSON lines)
        self.records: RecordSpool | None = RecordSpool(uuid_of, rows=rows) if capture else None
        # rejections (rare): reason code -> count, and -> (lowest request index, its detail)
        self.rejection_counts: dict[str, int] = {}
        self.rejection_examples: dict[str, tuple[int, str]] = {}
        self._files: dict[str, ColumnFile] | None = None  # (rows written out, once past SPILL_ROWS)
        self._written = 0
        # called with each request's record as it ends (capture only): a checkpoint monitor's feed
        # (simulator.checkpoints)
        self.observer = None

    def __len__(self) -> int:
        return self._written + len(self.index)

    @staticmethod
    def _raw_dtype(buf: array):
        return np.int32 if buf.typecode == "i" else _DTYPES[buf.typecode]

    def _spill(self) -> None:
        """The rows held go to the scratch files; the columns start empty."""
        if self._files is None:
            self._files = {name: ColumnFile(self._raw_dtype(getattr(self, name))) for name in _COLUMNS}
        self._written += len(self.index)
        for name in _COLUMNS:
            buf = getattr(self, name)
            self._files[name].append(np.frombuffer(buf, dtype=self._raw_dtype(buf)))
            setattr(self, name, array(buf.typecode))

    def column(self, name: str) -> np.ndarray:
        """A column as a numpy array: times float64, status int8, counts and indices int64."""
        buf = getattr(self, name)
        dtype = _DTYPES[buf.typecode]
        values = np.frombuffer(buf, dtype=self._raw_dtype(buf)) if len(buf) else np.zeros(0, dtype=dtype)
        if self._files is not None:
            values = np.concatenate((self._files[name].freeze()[:], values))
        return values.astype(np.int64) if buf.typecode == "i" else values

    def add(self, req: Request, final_status: int | None = None) -> None:
        if final_status is None:
            final_status = (
                STATUS_COMPLETED if req.status == COMPLETED else STATUS_REJECTED if req.status == REJECTED else STATUS_INCOMPLETE
            )
        if final_status == STATUS_REJECTED:
            self._count_rejection(req)
        self.index.append(req.index)
        self.status.append(final_status)
        self.arrival.append(req.arrival_ms)
        t = req.first_token_ms
        self.first_token.append(NAN if t is None else t)
        t = req.second_token_ms
        self.second_token.append(NAN if t is None else t)
        t = req.last_token_ms
        self.last_token.append(NAN if t is None else t)
        t = req.terminal_ms
        self.terminal.append(NAN if t is None else t)
        self.input_len.append(req.prompt_len)
        self.output_len.append(req.num_generated)
        self.requested.append(req.max_output)
        adm = req.admissions
        if len(adm) == 1 and adm[0][2] != "decode":  # (the usual case: one admission, for the prompt)
            reused = first = adm[0][1]
        else:
            prompt_adm = [r for _, r, pool in adm if pool != "decode"]
            reused = max(prompt_adm, default=0)
            first = prompt_adm[0] if prompt_adm else 0
        self.reused.append(reused)
        self.first_reused.append(first)
        self.host_reused.append(req.host_reused)
        self.activated.append(_f(req.handoff.get("destination_activated_ms")) if req.handoff else NAN)
        if self.records is not None:
            if self.records.rows is not None:  # rows only: the CSV row straight from the request
                rec = None
                row = row_of(self.uuid_of(req.index) if self.uuid_of else str(req.index), STATUS_LABELS[final_status],
                             _decode_worker(req), req.arrival_ms, req.first_admit_ms, req.first_token_ms,
                             req.last_token_ms, req.prompt_len, req.num_generated, reused, _itl(req))
                self.records.add_row(req.index, req.arrival_ms, row)
            else:
                rec = self._record(req, final_status, reused)
                row = None
                self.records.add(req.index, req.arrival_ms, rec)
            if self.observer is not None:
                self.observer(rec, row)
        if len(self.index) >= SPILL_ROWS:
            self._spill()

    def _count_rejection(self, req: Request) -> None:
        code = req.reject_reason or REJECT_UNKNOWN
        self.rejection_counts[code] = self.rejection_counts.get(code, 0) + 1
        ex = self.rejection_examples.get(code)
        if ex is None or req.index < ex[0]:
            self.rejection_examples[code] = (req.index, req.reject_detail or "")

    def _record(self, req: Request, status: int, reused: int) -> dict:
        """One requests.jsonl row (aggregated mode fields; keys sorted when written)."""
        arrival = req.arrival_ms
        first = req.first_token_ms
        last = req.last_token_ms
        n = req.num_generated
        ttft = None if first is None else first - arrival
        ttst = None if req.second_token_ms is None or first is None else req.second_token_ms - first
        itl = _itl(req)
        e2e = last - arrival if (status == STATUS_COMPLETED and last is not None) else None
        history = []
        per_pool: dict[str, int] = {}
        for k, (at, r, pool) in enumerate(req.admissions):
            history.append(
                {
                    "admission_ordinal": k,
                    "at_ms": at,
                    "is_readmission": k > 0 and pool == req.admissions[k - 1][2],
                    "pool": pool,
                    "pool_admission_ordinal": per_pool.get(pool, 0),
                    "reused_input_tokens": r,
                }
            )
            per_pool[pool] = per_pool.get(pool, 0) + 1
        h = req.handoff or {}
        decode_adm = [(at, r) for at, r, pool in req.admissions if pool == "decode"]
        prefill_adm = [at for at, _, pool in req.admissions if pool == "prefill"]
        return {
            "uuid": self.uuid_of(req.index) if self.uuid_of else str(req.index),
            "session_id": req.session_id,
            "turn_index": req.turn_index,
            "arrival_time_ms": arrival,
            "dispatched_at_ms": req.dispatched_ms,
            "first_admit_ms": req.first_admit_ms,
            "first_token_ms": first,
            "last_token_ms": last,
            "terminal_time_ms": req.terminal_ms,
            "terminal_status": STATUS_LABELS[status],
            "rejection_reason": (req.reject_reason or REJECT_UNKNOWN) if status == STATUS_REJECTED else None,
            "rejection_detail": req.reject_detail if status == STATUS_REJECTED else None,
            "ttft_ms": ttft,
            "ttst_ms": ttst,
            "itl_ms": itl,
            "e2e_latency_ms": e2e,
            "input_length": req.prompt_len,
            "output_length": n,
            "requested_output_length": req.max_output,
            "reused_input_tokens": reused,
            "first_admission_reused_input_tokens": req.admissions[0][1] if req.admissions else 0,
            "first_admission_host_reused_input_tokens": req.host_reused,
            "first_admission_g1_reused_input_tokens": (req.admissions[0][1] - req.host_reused) if req.admissions else 0,
            "decode_reused_input_tokens": max((r for _, r in decode_adm), default=None) if h else None,
            "admission_count": len(req.admissions),
            "readmission_count": sum(1 for e in history if e["is_readmission"]),
            "admission_history": history,
            "routing_history": req.routing,
            "prefill_route_overlap_tokens": _overlap(req.routing, "prefill" if h else "agg"),
            "decode_route_overlap_tokens": _overlap(req.routing, "decode") if h else None,
            "prefill_worker_idx": h.get("prefill_worker") if h else None,
            "decode_worker_idx": _decode_worker(req),
            "dp_rank": req.rank if req.rank >= 0 else None,
            "prefill_admit_ms": prefill_adm[0] if prefill_adm else None,
            "decode_admit_ms": (decode_adm[0][0] if decode_adm else None) if h else req.first_admit_ms,
            "source_held_ms": h.get("source_held_ms"),
            "source_released_ms": h.get("source_released_ms"),
            "destination_reserved_ms": h.get("destination_reserved_ms"),
            "destination_activated_ms": h.get("destination_activated_ms"),
            "kv_transfer_tokens": h.get("transfer_tokens"),
            "kv_transfer_ms": h.get("transfer_ms"),
        }
