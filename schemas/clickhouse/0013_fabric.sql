-- Fabric (issue 13): NIC samples from FabricSample, and job slowdown episodes from the perf service's
-- verdicts (JobSlowdownDetected / JobSlowdownCleared in the audit log).

-- One row per NIC per fabric sample: link state, trained rate, traffic, and counts within the interval
-- (NULL: the NIC or driver does not report it, or its counter restarted).
CREATE TABLE IF NOT EXISTS nic_samples
(
    cluster LowCardinality(String),
    node LowCardinality(String),
    nic LowCardinality(String),
    nic_index UInt16,
    gpu_index Nullable(Int16),
    leaf LowCardinality(String),
    ts DateTime64(3, 'UTC'),
    interval_s Float32,
    state LowCardinality(String),
    rate_gbps Nullable(Float32),
    tx_bytes_per_s Nullable(Float64),
    rx_bytes_per_s Nullable(Float64),
    errors Nullable(Int64),
    discards Nullable(Int64),
    pause Nullable(Int64),
    flaps Nullable(Int64),
    event_id String
)
ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, node, nic_index, ts)
TTL toDateTime(ts) + INTERVAL 30 DAY;

-- Slowdown episodes: one row per (job, episode), from detection to its clearing (NULL while open),
-- with the culprit and the job's speed against its own best when detected.
CREATE VIEW IF NOT EXISTS slowdown_episodes AS
SELECT
    d.job_id AS job_id,
    d.episode AS episode,
    d.since AS since,
    d.detected_at AS detected_at,
    c.cleared_at AS cleared_at,
    c.reason AS cleared_reason,
    d.culprit AS culprit,
    d.node AS node,
    d.gpu_index AS gpu_index,
    d.nic AS nic,
    d.leaf AS leaf,
    d.score AS score,
    d.reason AS reason
FROM
(
    SELECT
        job_id,
        JSONExtractUInt(body, 'episode') AS episode,
        toDateTime64(JSONExtractFloat(body, 'since'), 3, 'UTC') AS since,
        at AS detected_at,
        JSONExtractString(body, 'culprit') AS culprit,
        JSONExtractString(body, 'node') AS node,
        JSONExtract(body, 'gpu_index', 'Nullable(Int64)') AS gpu_index,
        JSONExtractString(body, 'nic') AS nic,
        JSONExtractString(body, 'leaf') AS leaf,
        JSONExtractFloat(body, 'score') AS score,
        JSONExtractString(body, 'reason') AS reason
    FROM events FINAL
    WHERE type = 'io.chamber.perf.job_slowdown_detected.v1'
) AS d
LEFT JOIN
(
    SELECT job_id, JSONExtractUInt(body, 'episode') AS episode, at AS cleared_at,
           JSONExtractString(body, 'reason') AS reason
    FROM events FINAL
    WHERE type = 'io.chamber.perf.job_slowdown_cleared.v1'
) AS c
ON d.job_id = c.job_id AND d.episode = c.episode
SETTINGS join_use_nulls = 1;
