-- `gpu_minute` as queries know it (issue 15): the newest computation of each GPU-minute in
-- `gpu_minute_rollup` (see 0150), read with FINAL so a minute recomputed but not yet merged counts
-- once. Same columns as the table it replaces; `util_avg` and `power_avg` still take `avgMerge`.
DROP TABLE IF EXISTS gpu_minute;

CREATE VIEW IF NOT EXISTS gpu_minute AS
SELECT
    cluster, node, gpu_index, minute, samples, seconds, util_seconds, util_avg, util_max, memory_used_max,
    power_avg, temperature_max
FROM gpu_minute_rollup FINAL;
