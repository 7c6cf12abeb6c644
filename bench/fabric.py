"""Job-slowdown detection on the simulated fleet: labelled scenarios through the real pieces.

Every scenario (services/perf/scenario.py) runs a gang of 8 or 64 nodes x 8 GPUs on a simulated fleet
at 1 Hz sampling on a virtual clock: the simulator's fabric and GPUs, the agent's GPU and NIC detectors,
the perf core, and the health core with the default policy. Fault scenarios inject one fault kind at
`--fault-at` on a random rank (or NIC, or the leaf of a random node for pfc_storm); healthy controls
run with noise (rank jitter, 2 s stalls), a phase change (an eval pass: every rank computes 1.6x
longer for 60 s), or load imbalance (ranks up to 12 % slower, always).

`--noise hard` runs every scenario with noise the thresholds were not tuned on (the job's step time
jitters +-15 %, each rank +-10 %, every rank permanently up to 15 % slower, sporadic symbol errors and
pause micro-bursts on healthy NICs) and adds `two_faults` (a slow GPU and a degraded NIC on two nodes
of one gang; attributed when the verdict names either) and `healthy_input_stall` (every rank waits on
its input for 60 s: a slower job with no GPU, NIC or switch at fault; a verdict on it counts against
precision).

Prints one JSON object: scenarios, detection_p50_s / p99_s, precision, recall, attribution_accuracy
(right kind and right node+GPU/NIC, or right leaf), false_isolations (on healthy controls), the work
lost per fault, moving the job off the culprit when health isolates it versus waiting for failure, and
the perf core's CPU cost per node sample (GPU sample + fabric sample folded, decisions included).

Step-table cases (`step_cases` in the output; `--steps-only` runs just them): synthetic per-rank step
timings (services/perf/step_cases.py, a model, NOT real traces) replayed through `chamber perf replay`'s
code (services/perf/replay.py: the perf and health cores on a virtual clock): a slow tensor-parallel
worker of 4 GPUs (1.5x from step 20), a rank slow from step one (2.35x), stage imbalance (the last of 4
pipeline stages computes 1.6x), data imbalance (work follows per-rank token counts), and healthy jobs
with the same 7 % step-time noise. Per case: precision, recall, attribution (the verdict names the slow
worker's node and every one of its GPUs), steps from onset to the verdict, straggler faults and
isolations (imbalance and healthy cases must have none). The step thresholds were set from published
rules before these cases existed (services/perf/steps.py), not fitted to them.

Work-lost model (GPU-hours, per fault; the assumptions are printed with the result):
- proactive: the job runs at the measured slowed speed until health takes the culprit out of service,
  then checkpoints on the signal and restarts elsewhere (RESTART_S); a hung job cannot checkpoint and
  also loses half a checkpoint interval. A fault that health does not isolate (shared congestion) gets
  no proactive move: it costs what waiting costs.
- waiting: a slowed job runs slow until a person notices (WAIT_S); a hung job waits for the NCCL
  timeout, loses half a checkpoint interval and restarts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import quantiles

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from services.perf.scenario import CONTROLS, FAULTS, GPUS, INPUT_STALL, TWO_FAULTS, Outcome, Scenario, plan, run

RESTART_S = 600.0  # checkpoint written on the signal, job rescheduled and restarted
CHECKPOINT_INTERVAL_S = 3600.0
NCCL_TIMEOUT_S = 1800.0  # torch.distributed's default NCCL timeout for init_process_group (30 min)
WAIT_S = 4 * 3600.0  # a slowed job, unnoticed: hours (Falcon: fail-slows last tens of seconds to ~10 h)


def work_lost(o: Outcome) -> tuple[float, float]:
    """(proactive, waiting) GPU-hours lost to one fault."""
    gpus = o.scenario.gang_nodes * GPUS
    hung = o.speed_during < 0.05
    waiting = NCCL_TIMEOUT_S + CHECKPOINT_INTERVAL_S / 2 + RESTART_S if hung else WAIT_S * (1.0 - o.speed_during)
    move = o.first_move_at
    if move is None:
        proactive = waiting
    else:
        held = max(0.0, move - o.scenario.fault_at)
        proactive = held * (1.0 - o.speed_during) + RESTART_S + (CHECKPOINT_INTERVAL_S / 2 if hung else 0.0)
    return gpus * proactive / 3600.0, gpus * waiting / 3600.0


def pct(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return round(quantiles(values, n=100, method="inclusive")[q - 1], 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2, help="scenarios per fault kind and gang size (2)")
    ap.add_argument("--gangs", default="8,64", help="gang sizes in nodes, comma-separated (8,64)")
    ap.add_argument("--fault-at", type=float, default=90.0, help="seconds of healthy running before the fault")
    ap.add_argument("--no-ras", action="store_true", help="nodes without NCCL RAS: progress from NIC traffic")
    ap.add_argument(
        "--noise",
        choices=("base", "hard"),
        default="base",
        help="hard: noise the detector was not tuned on (step and rank jitter, permanent imbalance, counter "
        "noise) in every scenario, and two faults at once (services/perf/scenario.py)",
    )
    ap.add_argument("--verbose", action="store_true", help="one line per scenario on stderr")
    ap.add_argument("--step-seeds", type=int, default=5, help="step-table cases per kind (5)")
    ap.add_argument("--steps-only", action="store_true", help="only the step-table cases (no simulated fleet)")
    args = ap.parse_args()
    if args.steps_only:
        print(json.dumps({"step_cases": step_cases(args.step_seeds)}, indent=2))
        return
    gangs = tuple(int(g) for g in args.gangs.split(","))
    scenarios: list[Scenario] = plan(args.seeds, gangs, args.fault_at, ras=not args.no_ras, noise=args.noise)
    started = time.perf_counter()
    outcomes = []
    for sc in scenarios:
        o = run(sc)
        outcomes.append(o)
        if args.verbose:
            d = o.detected
            print(
                f"{sc.name:<28} det {o.detection_s}  {d.culprit if d else '-'} {d.node if d else ''} "
                f"{d.gpu_index if d else ''} {d.leaf if d else ''}  ok={o.attributed} target={o.target} "
                f"early={len(o.early)} iso={len(o.isolations)} speed={o.speed_during:.2f}",
                file=sys.stderr,
            )
    faulty = [o for o in outcomes if o.scenario.faulty]
    healthy = [o for o in outcomes if not o.scenario.faulty]
    detected = [o for o in faulty if o.detected is not None]
    false_positives = sum(len(o.early) for o in outcomes)  # verdicts on healthy runs or before a fault
    delays = sorted(o.detection_s for o in detected if o.detection_s is not None)
    per_kind = {}
    for kind in (*FAULTS, *((TWO_FAULTS,) if args.noise == "hard" else ())):
        runs = [o for o in faulty if o.scenario.kind == kind]
        lost = [work_lost(o) for o in runs]
        per_kind[kind] = {
            "scenarios": len(runs),
            "detected": sum(1 for o in runs if o.detected),
            "attributed": sum(1 for o in runs if o.attributed),
            "detection_s": [o.detection_s for o in runs],
            "speed_during_fault": round(sum(o.speed_during for o in runs) / len(runs), 2) if runs else None,
            "isolated": sum(1 for o in runs if o.first_move_at is not None),
            "gpu_hours_lost_proactive": round(sum(p for p, _ in lost) / len(lost), 1) if lost else None,
            "gpu_hours_lost_waiting": round(sum(w for _, w in lost) / len(lost), 1) if lost else None,
        }
    controls = {
        kind: {
            "scenarios": sum(1 for o in healthy if o.scenario.kind == kind),
            "verdicts": sum(len(o.early) for o in healthy if o.scenario.kind == kind),
            "isolations": sum(len(o.isolations) for o in healthy if o.scenario.kind == kind),
            "verdict_culprits": sorted(e.culprit.value for o in healthy if o.scenario.kind == kind for e in o.early),
        }
        for kind in (*CONTROLS, *((INPUT_STALL,) if args.noise == "hard" else ()))
    }
    lost_all = [work_lost(o) for o in faulty]
    result = {
        "scenarios": len(outcomes),
        "fault_scenarios": len(faulty),
        "healthy_controls": len(healthy),
        "gang_nodes": list(gangs),
        "sampling_hz": 1.0,
        "nccl_ras": not args.no_ras,
        "noise": args.noise,
        "detection_p50_s": pct(delays, 50),
        "detection_p99_s": pct(delays, 99),
        "precision": round(len(detected) / (len(detected) + false_positives), 3) if detected else 0.0,
        "recall": round(len(detected) / len(faulty), 3) if faulty else None,
        "attribution_accuracy": round(sum(1 for o in faulty if o.attributed) / len(faulty), 3) if faulty else None,
        "false_isolations": sum(len(o.isolations) for o in healthy),
        "gpu_hours_lost_proactive": round(sum(p for p, _ in lost_all), 1),
        "gpu_hours_lost_waiting": round(sum(w for _, w in lost_all), 1),
        "per_kind": per_kind,
        "controls": controls,
        "work_lost_model": {
            "restart_s": RESTART_S,
            "checkpoint_interval_s": CHECKPOINT_INTERVAL_S,
            "nccl_timeout_s": NCCL_TIMEOUT_S,
            "unnoticed_slowdown_s": WAIT_S,
        },
        "perf_core_us_per_node_sample": round(
            1e6 * sum(o.perf_cpu_s for o in outcomes) / max(1, sum(o.node_samples for o in outcomes)), 1
        ),
        "wall_s": round(time.perf_counter() - started, 1),
    }
    result["step_cases"] = step_cases(args.step_seeds)
    print(json.dumps(result, indent=2))


def step_cases(seeds: int) -> dict[str, object]:
    """Every step-table case per seed through the replay (perf + health cores), scored per case."""
    from services.perf.replay import parse_rows, replay
    from services.perf.step_cases import CASES, make

    out: dict[str, object] = {}
    for case in CASES:
        runs = []
        for seed in range(1, seeds + 1):
            sc = make(case, seed)
            r = replay(parse_rows(sc.rows))
            ends = sorted({row["step"]: row["step_end_s"] for row in sc.rows}.items())
            right = [v for v in r.verdicts if sc.expected and v.pattern == sc.expected]
            first = right[0] if right else None
            steps_to = None
            if first is not None:
                at_step = next(step for step, end in ends if end >= first.at)
                steps_to = at_step - sc.onset_step + 1  # steps seen from the onset up to the verdict
            attributed = first is not None and (
                sc.expected != "slow_worker"
                or (first.node == sc.target_node and sorted(first.gpu_indices) == sorted(sc.target_gpus))
            )
            runs.append(
                {
                    "right": first is not None,
                    "wrong": len(r.verdicts) - len(right),
                    "attributed": attributed,
                    "steps_to_verdict": steps_to,
                    "stragglers": len(r.stragglers),
                    "isolations": len(r.isolations),
                    "isolated_gpus": sorted(
                        (d.node, d.gpu_index if d.gpu_index is not None else -1) for d in r.isolations
                    ),
                    "target": [sc.target_node, list(sc.target_gpus)],
                }
            )
        faulty = case in ("slow_worker_tp4", "slow_from_step_one")
        right = sum(1 for x in runs if x["right"])
        wrong = sum(int(x["wrong"]) for x in runs)  # type: ignore[call-overload]
        expect_verdict = case.startswith(("slow", "stage", "data"))
        false_iso = 0 if faulty else sum(int(x["isolations"]) for x in runs)  # type: ignore[call-overload]
        if faulty:  # an isolation of anything but the slow worker's GPUs is false too
            false_iso = sum(
                1
                for x in runs
                for node, gpu in x["isolated_gpus"]
                if [node, gpu] not in [[x["target"][0], g] for g in x["target"][1]]  # type: ignore[attr-defined,index]
            )
        out[case] = {
            "cases": len(runs),
            "expected": "slow_worker"
            if faulty
            else (case.split("_", 1)[0] + "_imbalance" if expect_verdict else "none"),
            "precision": round(right / (right + wrong), 3) if right + wrong else (1.0 if not expect_verdict else 0.0),
            "recall": round(right / len(runs), 3) if expect_verdict else None,
            "attribution": round(sum(1 for x in runs if x["attributed"]) / len(runs), 3) if expect_verdict else None,
            "steps_to_verdict": [x["steps_to_verdict"] for x in runs] if expect_verdict else None,
            "straggler_faults": sum(int(x["stragglers"]) for x in runs),  # type: ignore[call-overload]
            "isolations": sum(int(x["isolations"]) for x in runs),  # type: ignore[call-overload]
            "false_isolations": false_iso,
            "false_verdicts": wrong,
        }
    return out


if __name__ == "__main__":
    main()
