"""The meaning of the scheduler core's fold, for its snapshots (services/runtime/decider.py
`pickle_codec`).

Bump `STATE_VERSION` when a change makes a state folded by the previous release wrong for this one
(what a field means, what an event does to the state, a new index that must be built from the log);
the first start after the bump folds the log from the start. Comments, logs, a faster cycle: no bump.
The classes' fields are in the snapshot's format anyway: adding or removing one refuses old snapshots.
"""

# 2: degrading link facts (LinkHealth.degrading), jobs kept on degraded hardware, held isolations per node
# 3: idle verdicts to act on (idle.py: JobIdleDetected, JobResumeRequested)
# 4: GPU shares per node (Node.shared, Node.gpu_memory), GPU-equivalents in usage (fractional and MIG jobs)
# 5: MIG layouts of managed GPUs (Node.mig, SchedulerState.mig_nodes; MigLayoutPlanned/Applied folded),
#    GPU UUIDs per node (Node.gpu_uuids)
# 6: nodes' CPU and memory capacity (Node.cpu_milli, Node.memory_mib, from NodeDiscovered/NodeUpdated)
# 7: forgotten nodes leave the state, their ids reused (NodeForgotten, SchedulerState.free_nids)
STATE_VERSION = 7
