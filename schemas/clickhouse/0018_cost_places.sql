-- Where cost was incurred and what a price applies to (issue 18: cloud, on-premises and hybrid cost).
-- cost_ledger: the cluster, provider and region of the GPUs (discovery's chamber.io/ node labels);
-- prices: a price per instance type or per cluster (an on-premises amortised rate) has no gpu_model.
ALTER TABLE cost_ledger ADD COLUMN IF NOT EXISTS cluster String DEFAULT '';
ALTER TABLE cost_ledger ADD COLUMN IF NOT EXISTS provider LowCardinality(String) DEFAULT '';
ALTER TABLE cost_ledger ADD COLUMN IF NOT EXISTS region LowCardinality(String) DEFAULT '';
ALTER TABLE prices ADD COLUMN IF NOT EXISTS instance_type String DEFAULT '';
ALTER TABLE prices ADD COLUMN IF NOT EXISTS cluster String DEFAULT '';
