-- What the recorder writes. Every table keys rows on facts that a redelivered message repeats
-- (event id, or GPU and sample time), so a ReplacingMergeTree collapses any duplicate that got past
-- the recorder's own check; queries that must be exact read the tables with FINAL.

-- Raw GPU samples: one row per GPU per node sample, ordered for per-GPU time-range scans.
CREATE TABLE IF NOT EXISTS gpu_samples
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_index UInt16,
    gpu_uuid String,
    ts DateTime64(3, 'UTC'),
    interval_s Float32,
    seq UInt64,
    utilization_pct Nullable(Float32),
    memory_utilization_pct Nullable(Float32),
    sm_activity_pct Nullable(Float32),
    memory_used_mib Nullable(Float32),
    memory_total_mib Nullable(Float32),
    power_w Nullable(Float32),
    power_limit_w Nullable(Float32),
    temperature_c Nullable(Float32),
    sm_clock_mhz Nullable(Float32),
    mem_clock_mhz Nullable(Float32),
    ecc_sbe_volatile Nullable(Int64),
    ecc_dbe_volatile Nullable(Int64),
    pcie_replay_count Nullable(Int64),
    throttle_reasons Array(LowCardinality(String)),
    event_id String
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, node, gpu_index, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY;

-- Minute rollups per GPU, fed by a materialized view on every insert into gpu_samples.
-- util_seconds = sum(utilization / 100 * interval): the busy GPU-seconds of that minute.
CREATE TABLE IF NOT EXISTS gpu_minute
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_index UInt16,
    minute DateTime('UTC'),
    samples SimpleAggregateFunction(sum, UInt64),
    seconds SimpleAggregateFunction(sum, Float64),
    util_seconds SimpleAggregateFunction(sum, Float64),
    util_avg AggregateFunction(avg, Nullable(Float32)),
    util_max SimpleAggregateFunction(max, Nullable(Float32)),
    memory_used_max SimpleAggregateFunction(max, Nullable(Float32)),
    power_avg AggregateFunction(avg, Nullable(Float32)),
    temperature_max SimpleAggregateFunction(max, Nullable(Float32))
)
ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(minute)
ORDER BY (cluster, node, gpu_index, minute)
TTL minute + INTERVAL 400 DAY;

CREATE MATERIALIZED VIEW IF NOT EXISTS gpu_minute_mv TO gpu_minute AS
SELECT
    cluster,
    node,
    gpu_index,
    toStartOfMinute(ts) AS minute,
    toUInt64(count()) AS samples,
    sum(toFloat64(interval_s)) AS seconds,
    sum(coalesce(toFloat64(utilization_pct), 0) / 100 * interval_s) AS util_seconds,
    avgState(utilization_pct) AS util_avg,
    max(utilization_pct) AS util_max,
    max(memory_used_mib) AS memory_used_max,
    avgState(power_w) AS power_avg,
    max(temperature_c) AS temperature_max
FROM gpu_samples
GROUP BY cluster, node, gpu_index, minute;

-- Audit log: every domain event (and node inventories), its envelope and its JSON body.
CREATE TABLE IF NOT EXISTS events
(
    event_id String,
    type LowCardinality(String),
    stream LowCardinality(String),
    subject String,
    stream_seq UInt64,
    source String,
    ce_time String,
    at DateTime64(3, 'UTC'),
    team String,
    job_id String,
    cluster String,
    node String,
    body String
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(at)
ORDER BY (stream, toStartOfDay(at), event_id);

-- Job lifecycle facts, one row per event, with the GPUs a start event placed the job on.
CREATE TABLE IF NOT EXISTS job_events
(
    event_id String,
    job_id String,
    kind LowCardinality(String),
    at DateTime64(3, 'UTC'),
    stream_seq UInt64,
    team String,
    pool String,
    gpu_model String,
    priority String,
    gpus_requested UInt32,
    gpus Array(Tuple(cluster String, node String, gpu_index UInt16))
)
ENGINE = ReplacingMergeTree
ORDER BY (job_id, event_id);

-- Node and GPU isolations and restores (gpu_index -1: the whole node).
CREATE TABLE IF NOT EXISTS fleet_events
(
    event_id String,
    kind LowCardinality(String),
    cluster String,
    node String,
    gpu_index Int16,
    at DateTime64(3, 'UTC'),
    stream_seq UInt64,
    reason String
)
ENGINE = ReplacingMergeTree
ORDER BY (cluster, node, event_id);

-- The latest known model and labels of every GPU (from inventories and discovery).
CREATE TABLE IF NOT EXISTS gpu_inventory
(
    cluster String,
    node String,
    gpu_index UInt16,
    gpu_uuid String,
    model LowCardinality(String),
    labels Map(String, String),
    observed_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(observed_at)
ORDER BY (cluster, node, gpu_index);

CREATE TABLE IF NOT EXISTS pools
(
    pool String,
    gpu_model String,
    node_selector Map(String, String),
    at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(at)
ORDER BY pool;

CREATE TABLE IF NOT EXISTS prices
(
    event_id String,
    gpu_model String,
    at DateTime64(3, 'UTC'),
    price_per_gpu_hour Float64,
    currency LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (gpu_model, at, event_id);

CREATE TABLE IF NOT EXISTS budgets
(
    event_id String,
    team String,
    at DateTime64(3, 'UTC'),
    amount Float64,
    currency LowCardinality(String),
    period LowCardinality(String)
)
ENGINE = ReplacingMergeTree
ORDER BY (team, at, event_id);

-- Cost ledger: what billing accrued, per team and job (idle cost: per pool, idle = 1).
CREATE TABLE IF NOT EXISTS cost_ledger
(
    event_id String,
    period_start DateTime64(3, 'UTC'),
    period_end DateTime64(3, 'UTC'),
    gpu_model LowCardinality(String),
    gpu_seconds Float64,
    cost Float64,
    currency LowCardinality(String),
    team String,
    job_id String,
    pool String,
    idle UInt8
)
ENGINE = ReplacingMergeTree
PARTITION BY toYYYYMM(period_start)
ORDER BY (toStartOfDay(period_start), event_id);
