"""The ring of stages of ``k06_producer_consumer``, drawn, and its barrier traffic recorded
from the simulator: which warp waits on which barrier, with which parity, and what it waits
for.

* :func:`record_ring` runs the kernel on one 128 x 64 tile on the simulator (in a child
  process where this one runs on a GPU) inside ``ptx_mbarrier.record()``;
* :func:`phase_table` lists, per k-tile, the waits the producer and a consumer made and
  the phase each one waited for;
* :func:`happens_before` gives every event a logical time (a Lamport clock): one step after
  the thread's previous event, and a wait one step after the event that completed its
  phase; a copy completes ``copy_time`` steps after its issue. It depends on the order
  the barriers impose, not on how the simulator's threads happened to be scheduled, so the
  picture is the same on every run;
* :func:`ring_plot` and :func:`timeline_plot` draw them;
* :func:`record_pingpong` and :func:`turns_plot` do the same for ``k06_pingpong``, whose two
  consumers take turns: each consumer's K loops and epilogues on the logical clock.
"""
from __future__ import annotations

import matplotlib.pyplot as plt

from .common import run_on_simulator

__all__ = ["record_ring", "phase_table", "happens_before", "ring_plot", "timeline_plot",
           "broken_ring", "record_pingpong", "turns_plot"]

PRODUCER, CONSUMERS = 0, (128, 256)     # threadIdx.x of the threads the pictures follow


def _record(k_tiles, stages):
    import torch

    from . import harness, ptx_mbarrier
    from .kernels import k06_producer_consumer as k06pc
    a, b = harness.make_operands(128, 64, 64 * k_tiles, torch.float16, seed=0)
    out = torch.full((128, 64), float("nan"), dtype=torch.float16)
    with ptx_mbarrier.record() as events:
        k06pc.run(a, b, None, out, config=dict(BM=128, BN=64, STAGES=stages))
    ok = harness.compare(out, harness.reference(a, b), a, b, torch.float16)[0]
    if not ok:
        raise RuntimeError("the recorded run computed a wrong product")
    keep = {PRODUCER, *CONSUMERS, -1}
    return [dict(e) for e in events if e["thread"] in keep]


def record_ring(k_tiles=6, stages=4):
    """The barrier events of ``k06_producer_consumer`` on one 128 x 64 tile with ``k_tiles``
    k-tiles and ``stages`` stages, recorded on the simulator (the product is checked): the
    producer's thread, the first thread of each consumer warpgroup, and the copy engine."""
    return run_on_simulator("gemm_lessons.ring_timeline:_record", k_tiles, stages)


def _broken(bug):
    import torch

    from . import harness
    from .kernels import k06_producer_consumer as k06pc
    from .ptx_mbarrier import MbarrierDeadlock
    a, b = harness.make_operands(128, 64, 64 * 9, torch.float16, seed=0)
    out = torch.full((128, 64), float("nan"), dtype=torch.float16)
    try:
        k06pc.run(a, b, None, out, bug=bug)
    except MbarrierDeadlock as err:
        return f"{type(err).__name__}: {err}"
    return "no deadlock"


def broken_ring(bug):
    """What the simulator says when ``k06_producer_consumer`` is built with ``bug``
    ('parity' or 'no_release', see ``make_kernel``) and run on one 128 x 64 tile with 9
    k-tiles: the deadlock's message (on a GPU, in a simulator child process: the real
    kernel would hang)."""
    return run_on_simulator("gemm_lessons.ring_timeline:_broken", bug)


def phase_table(events):
    """One line per k-tile: the stage, the producer's wait on ``empty`` and the first
    consumer's wait on ``full``, each with its parity and the phase it waited for."""
    prod = [e for e in events if e["thread"] == PRODUCER and e["op"] == "wait"]
    cons = [e for e in events if e["thread"] == CONSUMERS[0] and e["op"] == "wait"
            and e["kind"] == "mbarrier"]

    def what(e):
        done = "the phase before the first" if e["phase"] < 0 else f"phase {e['phase']}"
        return f"{e['barrier']:<9} parity {e['parity']} ({done})"
    lines = [f"{'k-tile':>6}  {'producer waits on':<50}  consumers wait on"]
    for kt, (p, c) in enumerate(zip(prod, cons)):
        lines.append(f"{kt:>6}  {what(p):<50}  {what(c)}")
    return "\n".join(lines)


def happens_before(events, copy_time=3):
    """{event seq: logical time}: a thread's events one step apart; a wait at least one
    step after the last event that completed the phase it waited for (arrivals, and copies,
    which complete ``copy_time`` steps after their issue)."""
    clock, time, done = {}, {}, {}
    for e in sorted(events, key=lambda e: e["seq"]):
        key = (e["barrier"], e["kind"], e["phase"])
        if e["op"] == "complete_tx":
            t = time.get(e.get("origin"), 0) + copy_time
        else:
            t = clock.get(e["thread"], 0) + 1
            if e["op"] == "wait" and e["phase"] >= 0:
                t = max(t, done.get(key, 0) + 1)
            clock[e["thread"]] = t
        if e["op"] in ("arrive", "expect_tx", "complete_tx"):
            done[key] = max(done.get(key, 0), t)
        time[e["seq"]] = t
    return time


def _stage(name):
    return int(name.rsplit("[", 1)[1][:-1]) if name.endswith("]") else -1


def ring_plot(stages=4):
    """The ring: ``stages`` shared-memory stages in a row (k-tile kt uses stage kt % STAGES,
    then the ring wraps around), each guarded by ``full[s]`` (its TMA copies landed) and
    ``empty[s]`` (every consumer is done reading it); the producer above, the consumers
    below, and what each does to the two barriers."""
    fig, ax = plt.subplots(figsize=(10, 4.4))
    colors = plt.get_cmap("tab10").colors
    w = 1.6
    for s in range(stages):
        x = s * w
        ax.add_patch(plt.Rectangle((x, 0), w - 0.2, 1.0, color=colors[s], alpha=0.3))
        ax.text(x + w / 2 - 0.1, 0.62, f"stage {s}", ha="center", fontsize=10)
        ax.text(x + w / 2 - 0.1, 0.3, "A 128x64, B 64xBN", ha="center", fontsize=7)
        ax.text(x + w / 2 - 0.1, 1.12, f"full[{s}]", ha="center", fontsize=8)
        ax.text(x + w / 2 - 0.1, -0.25, f"empty[{s}]", ha="center", fontsize=8)
        ax.annotate("", xy=(x + w / 2 - 0.1, 1.35), xytext=(x + w / 2 - 0.1, 2.1),
                    arrowprops=dict(arrowstyle="->", color="tab:green"))
        ax.annotate("", xy=(x + w / 2 - 0.1, -0.4), xytext=(x + w / 2 - 0.1, -1.15),
                    arrowprops=dict(arrowstyle="->", color="tab:blue"))
    right = stages * w
    ax.text(right - 0.1, 0.5, "  then stage 0\n  again", va="center", fontsize=8, color="0.3")
    ax.text(right / 2, 2.25, "producer (one thread of warpgroup 0): wait empty[s] (parity "
            "(round & 1) ^ 1), expect_tx on full[s], TMA copies of A and B into stage s",
            ha="center", fontsize=8, color="tab:green")
    ax.text(right / 2, -1.5, "consumers (warpgroups 1 and 2): wait full[s] (parity round & 1), "
            "wgmma on stage s, arrive on empty[s]", ha="center", fontsize=8, color="tab:blue")
    ax.text(right / 2, -2.0, "round = kt // STAGES.  full[s]: the producer's bytes complete "
            "it, the consumers wait on it;  empty[s]: the consumers complete it, the producer "
            "waits on it", ha="center", fontsize=7, color="0.3")
    ax.set_xlim(-0.6, right + 1.2)
    ax.set_ylim(-2.2, 2.5)
    ax.axis("off")
    ax.set_title(f"A ring of {stages} stages and its two barrier sets")
    fig.tight_layout()
    return fig


def timeline_plot(events, copy_time=3):
    """The recorded events on their logical times: a row per role (the producer's thread,
    the copy engine, the first thread of each consumer warpgroup); a wait is a triangle at
    the step it returned, an arrival a dot, a copy a bar from issue to completion; colour:
    the stage; text: the barrier and the wait's parity."""
    t = happens_before(events, copy_time)
    rows = {PRODUCER: 3, -1: 2, CONSUMERS[0]: 1, CONSUMERS[1]: 0}
    colors = plt.get_cmap("tab10").colors
    fig, ax = plt.subplots(figsize=(12, 3.4))
    for e in events:
        if e["kind"] != "mbarrier" or e["thread"] not in rows:
            continue
        y, x, col = rows[e["thread"]], t[e["seq"]], colors[_stage(e["barrier"]) % 10]
        if e["op"] == "wait":
            ax.plot(x, y, "v", color=col, ms=8)
            ax.text(x, y + 0.18, f"{e['barrier']}\np={e['parity']}", ha="center", fontsize=6)
        elif e["op"] == "complete_tx":
            start = t.get(e.get("origin"), x - copy_time)
            ax.plot([start, x], [y, y], color=col, lw=5, alpha=0.5, solid_capstyle="butt")
        elif e["op"] in ("arrive", "expect_tx"):
            ax.plot(x, y - 0.15, "o", color=col, ms=5)
    ax.set_yticks(list(rows.values()), ["producer", "TMA copies", "consumer 1", "consumer 2"])
    ax.set_ylim(-0.5, 3.7)
    ax.set_xlabel("logical time (happens-before order: one step per barrier operation)")
    ax.set_title("Who waits on which barrier, when (recorded on the simulator; colour: "
                 "stage; v: a wait returns; o: an arrival)")
    fig.tight_layout()
    return fig


def _record_pingpong(tiles, k_tiles):
    import torch

    from . import harness, ptx_mbarrier
    from .kernels import k06_pingpong
    a, b = harness.make_operands(64, 64 * tiles, 64 * k_tiles, torch.float16, seed=0)
    out = torch.full((64, 64 * tiles), float("nan"), dtype=torch.float16)
    with ptx_mbarrier.record() as events:
        k06_pingpong.run(a, b, None, out, config=dict(BN=64, STAGES=4), blocks=1)
    if not harness.compare(out, harness.reference(a, b), a, b, torch.float16)[0]:
        raise RuntimeError("the recorded run computed a wrong product")
    keep = {PRODUCER, *CONSUMERS, -1}
    return [dict(e) for e in events if e["thread"] in keep]


def record_pingpong(tiles=4, k_tiles=3):
    """The barrier events of ``k06_pingpong`` on one block that walks ``tiles`` tiles of
    64 x 64, each of ``k_tiles`` k-tiles, recorded on the simulator (the product is
    checked): the producer's thread, the first thread of each consumer, the copy engine."""
    return run_on_simulator("gemm_lessons.ring_timeline:_record_pingpong", tiles, k_tiles)


def consumer_spans(events, copy_time=3):
    """{consumer thread: [(tile, K loop start, K loop end, epilogue end)]} on the logical
    clock of :func:`happens_before`: a K loop from the wait for the consumer's turn to its
    arrival on the other's turn; the epilogue up to its second named barrier."""
    t = happens_before(events, copy_time)
    spans = {}
    for c in CONSUMERS:
        mine = sorted((e for e in events if e["thread"] == c), key=lambda e: e["seq"])
        waits = [e for e in mine if e["op"] == "wait" and e["barrier"].startswith("turn")]
        hands = [e for e in mine if e["op"] == "arrive" and e["barrier"].startswith("turn")]
        named = [e for e in mine if e["kind"] == "named barrier"]
        spans[c] = [(2 * n + (c == CONSUMERS[1]), t[w["seq"]], t[h["seq"]],
                     t[named[2 * n + 1]["seq"]] + 1)
                    for n, (w, h) in enumerate(zip(waits, hands))]
    return spans


def turns_plot(events, copy_time=3):
    """Each consumer's K loops (the tensor cores are its) and epilogues on the logical
    clock: the K loops alternate, and each epilogue lies under the other consumer's K
    loop."""
    spans = consumer_spans(events, copy_time)
    fig, ax = plt.subplots(figsize=(11, 2.6))
    for row, c in enumerate(CONSUMERS):
        y = 1 - row
        for tile, k0, k1, e1 in spans[c]:
            ax.barh(y, k1 - k0, left=k0, height=0.5, color="tab:blue", alpha=0.7)
            ax.barh(y, e1 - k1, left=k1, height=0.5, color="tab:orange", alpha=0.7)
            ax.text((k0 + k1) / 2, y, f"tile {tile}: K loop", ha="center", va="center",
                    fontsize=7, color="white")
            ax.text((k1 + e1) / 2, y + 0.34, "epilogue", ha="center", fontsize=7)
    ax.set_yticks([1, 0], ["consumer 0", "consumer 1"])
    ax.set_ylim(-0.6, 1.7)
    ax.set_xlabel("logical time (happens-before order: one step per barrier operation)")
    ax.set_title("k06_pingpong on the simulator: the K loops take turns (blue), each "
                 "epilogue (orange) under the other's K loop")
    fig.tight_layout()
    return fig
