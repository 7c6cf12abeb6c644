-- Insert de-duplication by token (issue 15): the recorder names every insert by its rows
-- (`insert_deduplication_token`) and carries the de-duplication into the materialized view
-- (`deduplicate_blocks_in_dependent_materialized_views`), so a batch inserted twice (a retry after a
-- lost reply, a redelivery) cannot count twice in the minute rollup. Non-replicated tables keep the
-- tokens of their last N inserts only when asked; replicated tables (ON CLUSTER) do by default.
ALTER TABLE gpu_samples MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE gpu_minute MODIFY SETTING non_replicated_deduplication_window = 10000;
