-- Derived views: intervals from the recorded facts, and fleet efficiency over any window.
-- Windowed views are parameterized: SELECT ... FROM gpu_minutes(since = '...', until = '...').

CREATE VIEW IF NOT EXISTS current_prices AS
SELECT gpu_model, argMax(price_per_gpu_hour, (at, event_id)) AS price_per_gpu_hour
FROM prices
GROUP BY gpu_model;

-- Every GPU with its model and pool: the first pool (by name) whose model and node selector match;
-- a pool with neither spans the fleet and is chosen last; 'default' when no pool matches.
CREATE VIEW IF NOT EXISTS gpu_dim AS
WITH (SELECT groupArray((pool, gpu_model, node_selector)) FROM pools FINAL) AS all_pools
SELECT
    cluster,
    node,
    gpu_index,
    model,
    labels,
    arraySort(
        p -> (p.2 = '' AND empty(p.3), p.1),
        arrayFilter(
            p -> (p.2 = '' OR p.2 = model) AND arrayAll((k, v) -> labels[k] = v, mapKeys(p.3), mapValues(p.3)),
            all_pools
        )
    ) AS matching,
    if(empty(matching), 'default', matching[1].1) AS pool
FROM gpu_inventory FINAL;

-- Who held which GPUs when: from JobScheduled / JobResumed to the job's next stop
-- (preempted, suspended, requeued, completed, failed, cancelled); ended_at NULL while still held.
CREATE VIEW IF NOT EXISTS job_intervals AS
SELECT job_id, team, pool, priority, started_at, ended_at, end_kind, gpus
FROM
(
    SELECT
        job_id,
        kind,
        at AS started_at,
        gpus,
        max(team) OVER (PARTITION BY job_id) AS team,
        max(pool) OVER (PARTITION BY job_id) AS pool,
        max(priority) OVER (PARTITION BY job_id) AS priority,
        leadInFrame(toNullable(at)) OVER w AS ended_at,
        leadInFrame(kind) OVER w AS end_kind
    FROM (SELECT * FROM job_events FINAL)
    WHERE kind IN ('submitted', 'scheduled', 'resumed', 'preempted', 'suspended', 'requeued', 'completed', 'failed', 'cancelled')
    WINDOW w AS (PARTITION BY job_id ORDER BY at, stream_seq ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
)
WHERE kind IN ('scheduled', 'resumed');

CREATE VIEW IF NOT EXISTS job_gpu_intervals AS
SELECT job_id, team, pool, priority, started_at, ended_at, g.1 AS cluster, g.2 AS node, g.3 AS gpu_index
FROM job_intervals
ARRAY JOIN gpus AS g;

-- When each job waited: from submitted / preempted / requeued to its next start or end.
CREATE VIEW IF NOT EXISTS job_waits AS
SELECT job_id, team, need_gpus, gpu_model, waited_from, waited_until
FROM
(
    SELECT
        job_id,
        kind,
        at AS waited_from,
        max(team) OVER (PARTITION BY job_id) AS team,
        max(gpus_requested) OVER (PARTITION BY job_id) AS need_gpus,
        max(gpu_model) OVER (PARTITION BY job_id) AS gpu_model,
        leadInFrame(toNullable(at)) OVER w AS waited_until
    FROM (SELECT * FROM job_events FINAL)
    WHERE kind IN ('submitted', 'preempted', 'requeued', 'scheduled', 'resumed', 'completed', 'failed', 'cancelled')
    WINDOW w AS (PARTITION BY job_id ORDER BY at, stream_seq ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
)
WHERE kind IN ('submitted', 'preempted', 'requeued');

-- Node (gpu_index -1) and GPU isolations, from isolated to the next restore.
CREATE VIEW IF NOT EXISTS isolation_intervals AS
SELECT cluster, node, gpu_index, isolated_from, isolated_until, reason
FROM
(
    SELECT
        cluster,
        node,
        gpu_index,
        kind,
        reason,
        at AS isolated_from,
        leadInFrame(toNullable(at)) OVER w AS isolated_until
    FROM (SELECT * FROM fleet_events FINAL)
    WHERE kind IN ('node_isolated', 'node_restored', 'gpu_isolated', 'gpu_restored')
    WINDOW w AS (PARTITION BY cluster, node, gpu_index ORDER BY at, stream_seq
                 ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING)
)
WHERE kind IN ('node_isolated', 'gpu_isolated');

-- One row per GPU-minute in [since, until) that the GPU reported samples for:
--   capacity_s  = reported seconds x the share of the minute the GPU (and its node) was not isolated
--   allocated_s = reported seconds x the share of the minute a job held the GPU
--   busy_s      = busy GPU-seconds (utilization x time) x that same share
--   free_s      = healthy seconds that no job held; stranded_s = free_s while a job that would fit
--                 (needs no more GPUs of this model than were free that minute) was waiting
--   idle_cost   = (capacity_s - busy_s) at the model's current price
-- GPUs are joined on a 64-bit hash of (cluster, node, gpu_index) and minutes as UInt32: joining and
-- grouping on the strings was 3-4 times slower over a day of a 1,000-GPU fleet.
CREATE VIEW IF NOT EXISTS gpu_minutes AS
WITH
    samples AS
    (
        SELECT
            cityHash64(cluster, node, gpu_index) AS g, cityHash64(cluster, node) AS n, toUInt32(minute) AS minute,
            any(cluster) AS c_name, any(node) AS n_name, any(gpu_index) AS g_index,
            least(sum(seconds), 60) AS seconds, sum(util_seconds) AS util_seconds
        FROM gpu_minute
        WHERE minute >= toStartOfMinute({since:DateTime64(3, 'UTC')}) AND minute < {until:DateTime64(3, 'UTC')}
        GROUP BY g, n, minute
    ),
    held AS
    (
        SELECT cityHash64(cluster, node, gpu_index) AS g, m AS minute, least(sum(overlap), 60) AS held_s
        FROM
        (
            SELECT
                cluster, node, gpu_index,
                greatest(toFloat64(started_at), toFloat64({since:DateTime64(3, 'UTC')})) AS s,
                least(toFloat64(coalesce(ended_at, {until:DateTime64(3, 'UTC')})), toFloat64({until:DateTime64(3, 'UTC')})) AS e,
                arrayJoin(range(toUInt32(intDiv(toUInt64(s), 60) * 60), toUInt32(ceil(e)), 60)) AS m,
                least(e, toFloat64(m) + 60) - greatest(s, toFloat64(m)) AS overlap
            FROM job_gpu_intervals
            WHERE s < e
        )
        GROUP BY g, minute
    ),
    isolated AS
    (
        SELECT
            if(gpu_index < 0, cityHash64(cluster, node), cityHash64(cluster, node, toUInt16(gpu_index))) AS key,
            m AS minute, least(sum(overlap), 60) AS isolated_s
        FROM
        (
            SELECT
                cluster, node, gpu_index,
                greatest(toFloat64(isolated_from), toFloat64({since:DateTime64(3, 'UTC')})) AS s,
                least(toFloat64(coalesce(isolated_until, {until:DateTime64(3, 'UTC')})), toFloat64({until:DateTime64(3, 'UTC')})) AS e,
                arrayJoin(range(toUInt32(intDiv(toUInt64(s), 60) * 60), toUInt32(ceil(e)), 60)) AS m,
                least(e, toFloat64(m) + 60) - greatest(s, toFloat64(m)) AS overlap
            FROM isolation_intervals
            WHERE s < e
        )
        GROUP BY key, minute
    ),
    base AS
    (
        SELECT
            s.c_name AS cluster, s.n_name AS node, s.g_index AS gpu_index, s.minute AS minute,
            if(d.model = '', 'unknown', d.model) AS model,
            if(d.pool = '', 'default', d.pool) AS pool,
            s.seconds * (1 - least(greatest(coalesce(ig.isolated_s, 0), coalesce(inode.isolated_s, 0)), 60) / 60) AS capacity_s,
            s.seconds * coalesce(h.held_s, 0) / 60 AS allocated_s,
            s.util_seconds * coalesce(h.held_s, 0) / 60 AS busy_s,
            greatest(capacity_s - allocated_s, 0) AS free_s
        FROM samples AS s
        LEFT JOIN held AS h ON h.g = s.g AND h.minute = s.minute
        LEFT JOIN isolated AS ig ON ig.key = s.g AND ig.minute = s.minute
        LEFT JOIN isolated AS inode ON inode.key = s.n AND inode.minute = s.minute
        LEFT JOIN (SELECT cityHash64(cluster, node, gpu_index) AS g, model, pool FROM gpu_dim) AS d ON d.g = s.g
    ),
    waiting AS
    (
        SELECT m AS minute, gpu_model AS wanted_model, min(need_gpus) AS need
        FROM
        (
            SELECT
                gpu_model, need_gpus,
                greatest(toFloat64(waited_from), toFloat64({since:DateTime64(3, 'UTC')})) AS s,
                least(toFloat64(coalesce(waited_until, {until:DateTime64(3, 'UTC')})), toFloat64({until:DateTime64(3, 'UTC')})) AS e,
                arrayJoin(range(toUInt32(intDiv(toUInt64(s), 60) * 60), toUInt32(ceil(e)), 60)) AS m
            FROM job_waits
            WHERE s < e
        )
        GROUP BY minute, wanted_model
    ),
    free_by_model AS
    (
        SELECT minute, model, sum(free_s) / 60 AS free_gpus FROM base GROUP BY minute, model
    ),
    stranded AS
    (
        SELECT DISTINCT f.minute AS minute, f.model AS model
        FROM free_by_model AS f
        INNER JOIN waiting AS w ON f.minute = w.minute
        WHERE (w.wanted_model = '' OR w.wanted_model = f.model) AND f.free_gpus > 0 AND w.need <= f.free_gpus + 1e-6
    )
SELECT
    b.cluster AS cluster, b.node AS node, b.gpu_index AS gpu_index, toDateTime(b.minute, 'UTC') AS minute,
    b.model AS model, b.pool AS pool,
    b.capacity_s AS capacity_s, b.allocated_s AS allocated_s, b.busy_s AS busy_s, b.free_s AS free_s,
    if(st.model != '', b.free_s, 0) AS stranded_s,
    greatest(b.capacity_s - b.busy_s, 0) / 3600 * coalesce(p.price_per_gpu_hour, 0) AS idle_cost
FROM base AS b
LEFT JOIN stranded AS st ON st.minute = b.minute AND st.model = b.model
LEFT JOIN current_prices AS p ON p.gpu_model = b.model;

-- Per team: the GPU-seconds its jobs held, and how busy those GPUs were, per GPU-minute.
CREATE VIEW IF NOT EXISTS team_minutes AS
WITH
    samples AS
    (
        SELECT
            cityHash64(cluster, node, gpu_index) AS g, toUInt32(minute) AS minute,
            least(sum(seconds), 60) AS seconds, sum(util_seconds) AS util_seconds
        FROM gpu_minute
        WHERE minute >= toStartOfMinute({since:DateTime64(3, 'UTC')}) AND minute < {until:DateTime64(3, 'UTC')}
        GROUP BY g, minute
    ),
    held AS
    (
        SELECT
            team, cityHash64(cluster, node, gpu_index) AS g, m AS minute,
            any(cluster) AS c_name, any(node) AS n_name, any(gpu_index) AS g_index, least(sum(overlap), 60) AS held_s
        FROM
        (
            SELECT
                team, cluster, node, gpu_index,
                greatest(toFloat64(started_at), toFloat64({since:DateTime64(3, 'UTC')})) AS s,
                least(toFloat64(coalesce(ended_at, {until:DateTime64(3, 'UTC')})), toFloat64({until:DateTime64(3, 'UTC')})) AS e,
                arrayJoin(range(toUInt32(intDiv(toUInt64(s), 60) * 60), toUInt32(ceil(e)), 60)) AS m,
                least(e, toFloat64(m) + 60) - greatest(s, toFloat64(m)) AS overlap
            FROM job_gpu_intervals
            WHERE s < e
        )
        GROUP BY team, g, minute
    )
SELECT
    h.team AS team, h.c_name AS cluster, h.n_name AS node, h.g_index AS gpu_index, toDateTime(h.minute, 'UTC') AS minute,
    s.seconds * h.held_s / 60 AS allocated_s,
    s.util_seconds * h.held_s / 60 AS busy_s
FROM held AS h
INNER JOIN samples AS s ON s.g = h.g AND s.minute = h.minute;
