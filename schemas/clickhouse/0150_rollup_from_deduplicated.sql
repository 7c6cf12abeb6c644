-- Exact minute rollups (issue 15). The materialized view `gpu_minute_mv` summed every insert, so a
-- sample stored twice in two different batches (a redelivery the recorder could not recognise) was
-- counted twice in its minute, though the raw table collapses it. Instead the recorder now recomputes
-- each minute it touches from the de-duplicated raw rows (`gpu_samples FINAL`) into
-- `gpu_minute_rollup`, a ReplacingMergeTree keyed by GPU and minute whose newest computation
-- (`computed_at`) replaces the older ones: a recomputation replaces, a duplicate never adds.
-- `gpu_minute` becomes a view over it (0151), so every query keeps its name and its columns.
-- This file reads the old `gpu_minute` table; 0151, which replaces it, runs only after this one has
-- been recorded, so running this file again after a start that died half-way is harmless.

DROP VIEW IF EXISTS gpu_minute_mv;

CREATE TABLE IF NOT EXISTS gpu_minute_rollup
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    gpu_index UInt16,
    minute DateTime('UTC'),
    samples UInt64,
    seconds Float64,
    util_seconds Float64,
    util_avg AggregateFunction(avg, Nullable(Float32)),
    util_max Nullable(Float32),
    memory_used_max Nullable(Float32),
    power_avg AggregateFunction(avg, Nullable(Float32)),
    temperature_max Nullable(Float32),
    computed_at DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(computed_at)
PARTITION BY toYYYYMM(minute)
ORDER BY (cluster, node, gpu_index, minute)
TTL minute + INTERVAL 400 DAY;

-- The minutes a recorder stored samples for and has not recomputed yet (it recomputes every few
-- seconds, not after every batch: a minute is read once per round, not once per batch). Written
-- with the samples, before their batch is acked (a node-minute about once per round), so a recorder
-- that dies before its next round leaves them here for the next one; `gpu_minute_progress` says up
-- to which `at` all are done. Kept a day: a recorder down longer than that leaves its last minutes
-- as they were last computed.
CREATE TABLE IF NOT EXISTS gpu_minute_pending
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    minute DateTime('UTC'),
    at DateTime64(6, 'UTC') DEFAULT now64(6)
)
ENGINE = MergeTree
ORDER BY at
TTL toDateTime(at) + INTERVAL 1 DAY;

CREATE TABLE IF NOT EXISTS gpu_minute_progress
(
    name String,
    done_until DateTime64(6, 'UTC')
)
ENGINE = ReplacingMergeTree(done_until)
ORDER BY name;

-- Minutes already rolled up keep their values (version 0) where the raw rows have expired ...
INSERT INTO gpu_minute_rollup
SELECT
    cluster, node, gpu_index, minute,
    sum(samples), sum(seconds), sum(util_seconds), avgMergeState(util_avg), max(util_max),
    max(memory_used_max), avgMergeState(power_avg), max(temperature_max), toDateTime64(0, 6, 'UTC')
FROM gpu_minute
GROUP BY cluster, node, gpu_index, minute;

-- ... and the last day is recomputed from the de-duplicated raw rows (version 1 wins). Only a day:
-- the recorder runs migrations before it consumes, and TELEMETRY keeps minutes, not days; older
-- minutes keep their values (counted twice only where a duplicate got in, which is rare).
INSERT INTO gpu_minute_rollup
SELECT
    cluster, node, gpu_index, toStartOfMinute(ts) AS minute,
    toUInt64(count()), sum(toFloat64(interval_s)), sum(coalesce(toFloat64(utilization_pct), 0) / 100 * interval_s),
    avgState(utilization_pct), max(utilization_pct), max(memory_used_mib), avgState(power_w), max(temperature_c),
    toDateTime64(0.000001, 6, 'UTC')
FROM gpu_samples FINAL
WHERE ts >= now() - INTERVAL 1 DAY
GROUP BY cluster, node, gpu_index, minute;
