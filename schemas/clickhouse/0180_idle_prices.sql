-- Idle cost priced as billing prices (issue 18): a GPU's node's instance type, else its cluster (an
-- on-premises rate), else its GPU model, at the current price of each (services/billing/core.py price_of).

-- Where each node runs: the chamber.io/ labels of discovery's latest NodeDiscovered / NodeUpdated for
-- it (the audit log keeps them all). gpu_inventory keeps one row per GPU, and the agent's own
-- inventories (without discovery's labels) overwrite it every minute, so it cannot say this.
CREATE VIEW IF NOT EXISTS node_places AS
SELECT
    cluster,
    node,
    argMax(JSONExtractString(body, 'labels', 'chamber.io/provider'), (at, stream_seq)) AS provider,
    argMax(JSONExtractString(body, 'labels', 'chamber.io/region'), (at, stream_seq)) AS region,
    argMax(JSONExtractString(body, 'labels', 'chamber.io/zone'), (at, stream_seq)) AS zone,
    argMax(JSONExtractString(body, 'labels', 'chamber.io/instance-type'), (at, stream_seq)) AS instance_type
FROM events
WHERE type IN ('io.chamber.fleet.node_discovered.v1', 'io.chamber.fleet.node_updated.v1')
GROUP BY cluster, node;

-- Every GPU's price per GPU-hour and which entry of the price table gave it (price_scope
-- instance_type | cluster | gpu_model; '' and 0 when none applies).
CREATE VIEW IF NOT EXISTS gpu_prices AS
SELECT
    g.cluster AS cluster,
    g.node AS node,
    g.gpu_index AS gpu_index,
    g.model AS model,
    np.instance_type AS instance_type,
    multiIf(it.found = 1, it.price, cl.found = 1, cl.price, md.found = 1, md.price, 0) AS price_per_gpu_hour,
    multiIf(it.found = 1, 'instance_type', cl.found = 1, 'cluster', md.found = 1, 'gpu_model', '') AS price_scope
FROM (SELECT cluster, node, gpu_index, model FROM gpu_inventory FINAL) AS g
LEFT JOIN node_places AS np ON np.cluster = g.cluster AND np.node = g.node
LEFT JOIN
(
    SELECT instance_type, argMax(price_per_gpu_hour, (at, event_id)) AS price, toUInt8(1) AS found
    FROM prices WHERE instance_type != '' GROUP BY instance_type
) AS it ON it.instance_type = np.instance_type
LEFT JOIN
(
    SELECT cluster, argMax(price_per_gpu_hour, (at, event_id)) AS price, toUInt8(1) AS found
    FROM prices WHERE cluster != '' AND instance_type = '' GROUP BY cluster
) AS cl ON cl.cluster = g.cluster
LEFT JOIN
(
    SELECT gpu_model, argMax(price_per_gpu_hour, (at, event_id)) AS price, toUInt8(1) AS found
    FROM prices WHERE instance_type = '' AND cluster = '' GROUP BY gpu_model
) AS md ON md.gpu_model = g.model;
