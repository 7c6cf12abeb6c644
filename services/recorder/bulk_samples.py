"""Node samples decoded in bulk, straight into warehouse columns.

The recorder's hot path. A fetched batch's JSON bodies, one per line, go through Arrow's JSON reader
(C++, with the GIL released, so the event loop keeps pulling while it runs) into nested columns,
which are flattened to one row per GPU. No Python object is made per sample or per GPU.

The strict per-message decode (`LeanNodeSample`) stays the reference. Anything it would refuse makes
the whole batch refused here (`BatchRefused`): a wrong type, a missing required field, a null where
none is allowed, a body that is not one JSON object on one line. The caller then takes the
per-message path, which stores the good samples and dead-letters the rest with the reason.

Samples come in the compact wire form (fields at their defaults left out) or the old full form (nulls
and empty lists written out); both give the same rows. A left-out slow field (`slow_omitted`) is a
null in its column, as in the per-message path.
"""

from __future__ import annotations

import re

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from services.recorder.rows import SAMPLE_FLOATS, SAMPLE_INTS, TS, LeanGpuSample, LeanNodeSample

F32 = pa.float32()

_GPU = pa.struct(
    [
        ("index", pa.uint16()),
        ("uuid", pa.string()),
        *((name, F32) for name in SAMPLE_FLOATS),
        ("throttle_reasons", pa.list_(pa.string())),
        *((name, pa.int64()) for name in SAMPLE_INTS),
    ]
)
_SAMPLE = pa.schema(
    [
        ("cluster", pa.string()),
        ("node", pa.string()),
        ("seq", pa.uint64()),
        ("observed_at", pa.float64()),
        ("interval_s", pa.float64()),
        ("gpus", pa.list_(_GPU)),
    ]
)
# Same fields as the strict decode, so both paths store the same columns.
assert set(_GPU.names) == set(LeanGpuSample.__struct_fields__)
assert set(_SAMPLE.names) == set(LeanNodeSample.__struct_fields__)

# Fields the strict decode requires (no default): a null or a missing one refuses the batch.
_REQUIRED = ("cluster", "node", "seq", "observed_at", "interval_s", "gpus")
_REQUIRED_GPU = ("index", "uuid")
# throttle_reasons defaults to [] (left out of the compact form) but may not be null: Arrow reads both
# as null, so an explicit null is looked for in the text.
_NULL_REASONS = re.compile(rb'"throttle_reasons"\s*:\s*null')
_NO_REASONS = pa.scalar([], pa.list_(pa.string()))

_PARSE = pj.ParseOptions(explicit_schema=_SAMPLE, unexpected_field_behavior="ignore", newlines_in_values=False)


class BatchRefused(Exception):
    """The batch needs the per-message decode; the message says why (for the log, not the user)."""


def sample_table(bodies: list[bytes], ids: list[str]) -> pa.Table:
    """One row per GPU of every sample, columns as `rows.sample_columns` makes them from lean structs.

    `ids[i]` is the event id of `bodies[i]`. Raises BatchRefused when any body is not a sample the
    strict decode would accept.
    """
    if not bodies:
        raise BatchRefused("empty batch")
    for body in bodies:
        # One line per body: the reader splits on line ends, so a body must not contain one.
        if not body.startswith(b"{") or b"\n" in body or b"\r" in body:
            raise BatchRefused("a body is not one JSON object on one line")
    data = b"\n".join(bodies)
    if _NULL_REASONS.search(data):
        raise BatchRefused("gpus[].throttle_reasons is null")
    try:
        parsed = pj.read_json(
            pa.BufferReader(data),
            read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1),
            parse_options=_PARSE,
        )
    except pa.ArrowException as exc:  # malformed JSON, a wrong type, a number out of range
        raise BatchRefused(f"JSON: {exc}") from None
    if parsed.num_rows != len(bodies):  # a line holding two objects would shift every later id
        raise BatchRefused(f"{parsed.num_rows} objects from {len(bodies)} bodies")
    for name in _REQUIRED:
        if parsed.column(name).null_count:
            raise BatchRefused(f"{name} missing or null")
    gpus = parsed.column("gpus").combine_chunks()
    per_gpu = gpus.flatten()  # the GPUs of all samples, in order
    if per_gpu.null_count:
        raise BatchRefused("a GPU entry is null")
    for name in _REQUIRED_GPU:
        if per_gpu.field(name).null_count:
            raise BatchRefused(f"gpus[].{name} missing or null")
    if len(per_gpu) == 0:
        raise BatchRefused("no GPUs")
    parent = pc.list_parent_indices(gpus)

    def repeated(values: pa.ChunkedArray | pa.Array, dtype: pa.DataType | None = None) -> pa.Array:
        values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
        out = values.take(parent)
        return out.cast(dtype) if dtype is not None else out

    # round(observed_at * 1000) like the per-message path: half to even, as Python's round().
    ts_ms = pc.round(pc.multiply(parsed.column("observed_at"), 1000.0), round_mode="half_to_even")
    columns: dict[str, pa.Array] = {
        "cluster": repeated(parsed.column("cluster")),
        "node": repeated(parsed.column("node")),
        "ts": repeated(pc.cast(ts_ms, pa.int64()), TS),
        "interval_s": repeated(parsed.column("interval_s"), F32),
        "seq": repeated(parsed.column("seq")),
        "event_id": repeated(pa.array(ids, pa.string())),
        "gpu_index": per_gpu.field("index"),
        "gpu_uuid": per_gpu.field("uuid"),
        "throttle_reasons": pc.fill_null(per_gpu.field("throttle_reasons"), _NO_REASONS),
    }
    for name in (*SAMPLE_FLOATS, *SAMPLE_INTS):
        columns[name] = per_gpu.field(name)
    return pa.table(columns)
