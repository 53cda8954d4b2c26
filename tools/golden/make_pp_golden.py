#!/usr/bin/env python3
"""Golden pipeline schedules for tests/test_pp_schedule.c, computed by PyTorch's own pipelining
code (torch.distributed.pipelining.schedules): the per-rank compute orders of ScheduleGPipe,
Schedule1F1B, ScheduleInterleaved1F1B, ScheduleLoopedBFS, ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble and ScheduleDualPipeV, those orders lowered by _add_send_recv (stage s on
rank s % pp; the V mapping for ZBV and DualPipeV) and simulated by _simulate_comms_compute, and
lowered by _add_unshard_reshard + _add_reduce_grad + _add_send_recv as
_prepare_schedule_with_comms does.
The schedule classes are built without stages (their pipeline-order methods read only the sizes
set below). Each list is stored as the FNV-1a 64 hash of its CSV text as csv.writer writes it
(PyTorch's _dump_csv), so the file stays small; --show prints the text of one case.

Adjustments, each a difference the C side documents (include/hyperparallel/pp_schedule.h):
* WAIT_REDUCE_GRAD (PyTorch 2.15 adds one after each REDUCE_GRAD) is dropped.
* Schedule1F1B numbers the last rank's forwards 1..n; its stored order is kept as PyTorch makes
  it ("order"), and the lowered / simulated lists use that order with those forwards renumbered
  0..n-1 (PyTorch's own order cannot be lowered: it never sends microbatch n).
* GPipe / 1F1B: the stored order already passed _add_reduce_grad (bubbles dropped); it is
  lowered without its REDUCE_GRAD actions.
* DualPipeV: PyTorch's _simulate_comms_compute does not model OVERLAP_F_B (it raises), so its
  steps are written as -1 and the C test only requires its own simulation to finish.

Run:  /opt/torchvenv/bin/python tools/golden/make_pp_golden.py > tests/data/pp_schedule_golden.txt
      /opt/torchvenv/bin/python tools/golden/make_pp_golden.py --show interleaved1f1b 2 8 4
"""
import csv
import io
import sys

import torch
from torch.distributed.pipelining import schedules as S

# TestSchedulePlan.setUp's (num_local_stages, num_microbatches, group_size), plus cases where
# Interleaved1F1B must refuse n % rounds != 0
GRID = [(2, 2, 2), (2, 4, 4), (2, 8, 2), (2, 8, 4), (2, 8, 8), (4, 4, 4), (4, 8, 4), (4, 8, 8), (4, 16, 4),
        (4, 32, 4), (4, 64, 4), (4, 16, 16), (4, 32, 32), (4, 128, 64), (3, 2, 2), (3, 8, 2), (3, 12, 4), (4, 6, 3),
        (4, 10, 5), (2, 3, 4), (2, 4, 4), (2, 10, 4), (2, 15, 4), (2, 9, 4), (3, 14, 4), (1, 4, 4), (1, 3, 1)]
SINGLE = [(P, n) for P in (1, 2, 3, 4, 8) for n in (1, 2, 3, 4, 8, 16)]
# more 2-stage-per-rank cases for the V schedules (PyTorch's DualPipeV regression is (2, 10, 4))
V_GRID = [(2, 1, 2), (2, 3, 2), (2, 5, 2), (2, 6, 3), (2, 12, 3), (2, 16, 4), (2, 7, 4)]


def fnv64(text):
    h = 0xcbf29ce484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def csv_text(order):
    out = io.StringIO()
    w = csv.writer(out)
    for r in sorted(order):
        w.writerow(order[r])
    return out.getvalue()


def strip(actions, types):
    return [a for a in actions if a is None or a.computation_type not in types]


WAIT = {S._ComputationType.WAIT_REDUCE_GRAD} if hasattr(S._ComputationType, "WAIT_REDUCE_GRAD") else set()


V_KINDS = (S.ScheduleZBVZeroBubble, S.ScheduleDualPipeV)


def mapping(P, num_stages, v):
    if not v:
        return lambda s: s % P
    m = S.generate_stage_to_rank_mapping(P, num_stages, style="v")
    return lambda s: m[s]


def lower_send_recv(order, P, num_stages, v=False):
    comms = S._add_send_recv({r: list(order[r]) for r in order}, mapping(P, num_stages, v), num_stages)
    try:
        sim = S._simulate_comms_compute({r: list(comms[r]) for r in comms}, mapping(P, num_stages, v), num_stages)
        steps = max(len(sim[r]) for r in sim)
    except (ValueError, KeyError, AssertionError):
        steps = -1
    return comms, steps


def lower_full(order, P, n, num_stages, v=False):
    low = {}
    for r in order:
        a = S._add_unshard_reshard(list(order[r]))
        low[r] = strip(S._add_reduce_grad(a, n), WAIT)
    return S._add_send_recv(low, mapping(P, num_stages, v), num_stages)


def multi(cls, L, n, P):
    o = cls.__new__(cls)
    o.pp_group_size, o._n_microbatches, o.n_local_stages, o._stages = P, n, L, [None] * L
    o.num_stages = o._num_stages = L * P
    if cls in (S.ScheduleInterleaved1F1B, S.ScheduleInterleavedZeroBubble):
        o.number_of_rounds = max(1, n // P)
        o.microbatches_per_round = n // o.number_of_rounds
        if n % o.number_of_rounds != 0:
            return None
    if cls in V_KINDS and L != 2:
        return None   # "ZBV requires exactly 2 stages per rank"
    if cls is S.ScheduleDualPipeV and n < L * P:
        return None   # "DualPipeV requires at least as many microbatches as stages"
    order = {r: o._calculate_single_rank_operations(r) for r in range(P)}
    if cls is S.ScheduleInterleavedZeroBubble:
        o.pipeline_order = order
        order = o._add_bubbles_to_actions(L * P)
    return order


def single(cls, P, n):
    if cls is S.Schedule1F1B and n < P:
        return None
    o = cls.__new__(cls)
    o._num_stages, o._n_microbatches = P, n
    return {r: strip(a, WAIT) for r, a in o._get_pipeline_order().items()}


def fix_1f1b(order, P):
    """The last rank's forwards renumbered 0..n-1 (see the module docstring)."""
    last = [a if a is None or a.computation_type != S.F else S._Action(a.stage_index, S.F, a.microbatch_index - 1)
            for a in order[P - 1]]
    return {**order, P - 1: last}


def cases():
    for name, cls in (("interleaved1f1b", S.ScheduleInterleaved1F1B), ("loopedbfs", S.ScheduleLoopedBFS),
                      ("interleavedzerobubble", S.ScheduleInterleavedZeroBubble),
                      ("zbvzerobubble", S.ScheduleZBVZeroBubble), ("dualpipev", S.ScheduleDualPipeV)):
        v = cls in V_KINDS
        for L, n, P in GRID + (V_GRID if v else []):
            if cls is not S.ScheduleInterleaved1F1B and cls is not S.ScheduleLoopedBFS and P * L * n > 4096:
                continue   # the large grid cases add nothing new for the zero-bubble kinds
            order = multi(cls, L, n, P)
            if order is None:
                yield name, L, n, P, None
                continue
            S._validate_schedule(order, P, L * P, n)
            comms, steps = lower_send_recv(order, P, L * P, v)
            yield name, L, n, P, (order, comms, steps, lower_full(order, P, n, L * P, v))
    for name, cls in (("gpipe", S.ScheduleGPipe), ("1f1b", S.Schedule1F1B)):
        for P, n in SINGLE:
            order = single(cls, P, n)
            if order is None:
                yield name, 1, n, P, None
                continue
            compute = fix_1f1b(order, P) if cls is S.Schedule1F1B else order
            compute = {r: strip(a, {S.REDUCE_GRAD}) for r, a in compute.items()}
            S._validate_schedule(compute, P, P, n)
            comms, steps = lower_send_recv(compute, P, P)
            yield name, 1, n, P, (order, comms, steps, lower_full(compute, P, n, P))


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--show":
        want = (sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        for name, L, n, P, res in cases():
            if (name, L, n, P) == want and res:
                for title, sch in (("order", res[0]), ("send_recv", res[1]), ("lowered", res[3])):
                    print(f"== {title}\n{csv_text(sch)}")
                print(f"== steps {res[2]}")
        return
    print(f"# tests/test_pp_schedule.c golden schedules from torch {torch.__version__} "
          "(tools/golden/make_pp_golden.py).")
    print("# kind L n P  order=fnv64(csv of the compute order)  send_recv=fnv64(_add_send_recv)  "
          "steps=_simulate_comms_compute steps  lowered=fnv64(unshard/reshard + reduce_grad + send_recv); "
          "'error' = the constructor raises")
    for name, L, n, P, res in cases():
        if res is None:
            print(f"{name} {L} {n} {P} error")
            continue
        order, comms, steps, low = res
        print(f"{name} {L} {n} {P} order={fnv64(csv_text(order))} send_recv={fnv64(csv_text(comms))} "
              f"steps={steps} lowered={fnv64(csv_text(low))}")


if __name__ == "__main__":
    main()
