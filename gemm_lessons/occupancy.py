"""Occupancy: how many blocks of a kernel an SM holds at once, and what limits it; and the
SASS instruction mix of a compiled kernel. Both work with no GPU (ptxas, nvdisasm).

An SM keeps several warps resident and switches to one that is ready whenever the warp it
runs waits (for memory, for a barrier). *Occupancy* is the number of resident warps over
the most the SM can hold (64 on compute capability 8.0 and 9.0). A block becomes resident
only whole, so four resources cap how many blocks fit: registers (each warp's share is
rounded up to 256), shared memory (plus 1 KB per block that the system reserves on 8.0
and later), threads, and a fixed count of blocks. The smallest cap wins::

    from gemm_lessons import compiled, occupancy
    rep = compiled.ptxas_report(compiled.ptx("k02_smem_tiling", (9, 0)), (9, 0))
    print(occupancy.occupancy(rep["registers"], rep["smem_bytes"], threads=1024, cc=(9, 0)))

The per-SM limits are those of the CUDA C++ Programming Guide ("Technical Specifications
per Compute Capability"), with the register and shared-memory allocation rules of NVIDIA's
CUDA Occupancy Calculator. The shared memory per SM is the most an SM can configure (the
rest of the 256 KB on 9.0 is L1 cache); a kernel with little shared memory may run with a
smaller carve-out, which caps it no lower than computed here in practice.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

__all__ = ["LIMITS", "Occupancy", "occupancy", "sass", "sass_mix"]

KB = 1024
# cc: registers/SM, shared bytes/SM (max carve-out), shared bytes/block max, threads/SM,
#     blocks/SM, shared bytes reserved per block by the system
LIMITS = {
    (7, 0): dict(regs=65536, smem_sm=96 * KB, smem_block=96 * KB, threads=2048, blocks=32,
                 reserved=0),
    (7, 5): dict(regs=65536, smem_sm=64 * KB, smem_block=64 * KB, threads=1024, blocks=16,
                 reserved=0),
    (8, 0): dict(regs=65536, smem_sm=164 * KB, smem_block=163 * KB, threads=2048, blocks=32,
                 reserved=1 * KB),
    (8, 6): dict(regs=65536, smem_sm=100 * KB, smem_block=99 * KB, threads=1536, blocks=16,
                 reserved=1 * KB),
    (8, 9): dict(regs=65536, smem_sm=100 * KB, smem_block=99 * KB, threads=1536, blocks=24,
                 reserved=1 * KB),
    (9, 0): dict(regs=65536, smem_sm=228 * KB, smem_block=227 * KB, threads=2048, blocks=32,
                 reserved=1 * KB),
}
REG_UNIT = 256          # registers are allocated per warp in units of 256
SMEM_UNIT = 128         # shared memory is allocated per block in units of 128 bytes
MAX_REGS = 255          # per thread, every capability here


@dataclass(frozen=True)
class Occupancy:
    """Blocks per SM and what caps them; ``warps / max_warps`` is the occupancy."""
    blocks: int                 # resident blocks per SM
    warps: int                  # resident warps per SM
    max_warps: int
    limiter: str                # 'registers', 'shared memory', 'threads' or 'blocks'
    caps: dict                  # blocks allowed by each resource alone

    @property
    def fraction(self) -> float:
        return self.warps / self.max_warps

    def __str__(self):
        caps = ", ".join(f"{k} {v}" for k, v in self.caps.items())
        return (f"{self.blocks} block(s)/SM = {self.warps} of {self.max_warps} warps "
                f"({self.fraction:.0%}); limited by {self.limiter} (blocks allowed by {caps})")


def _limits(cc):
    cc = tuple(cc)
    if cc not in LIMITS:
        raise ValueError(f"no occupancy limits for compute capability {cc[0]}.{cc[1]}; "
                         f"known: {', '.join(f'{a}.{b}' for a, b in LIMITS)}")
    return LIMITS[cc]


def occupancy(regs: int, smem: int, threads: int, cc=(9, 0)) -> Occupancy:
    """Resident blocks and warps per SM for a kernel using ``regs`` registers per thread
    and ``smem`` bytes of shared memory per block, launched with ``threads`` per block."""
    lim = _limits(cc)
    if not 1 <= threads <= 1024:
        raise ValueError(f"threads per block must be 1..1024, got {threads}")
    if not 0 <= regs <= MAX_REGS:
        raise ValueError(f"registers per thread must be 0..{MAX_REGS}, got {regs}")
    if smem < 0 or smem > lim["smem_block"]:
        raise ValueError(f"{smem} bytes of shared memory per block: the most a block may use "
                         f"on {cc[0]}.{cc[1]} is {lim['smem_block']}")
    warps = -(-threads // 32)
    max_warps = lim["threads"] // 32
    regs_per_warp = -(-max(regs, 1) * 32 // REG_UNIT) * REG_UNIT
    smem_per_block = -(-(smem + lim["reserved"]) // SMEM_UNIT) * SMEM_UNIT
    caps = {"registers": lim["regs"] // (regs_per_warp * warps),
            "shared memory": lim["smem_sm"] // smem_per_block if smem_per_block else lim["blocks"],
            "threads": max_warps // warps,
            "blocks": lim["blocks"]}
    limiter = min(caps, key=caps.get)      # the first of equal caps, in the order above
    blocks = caps[limiter]
    if blocks == 0:
        raise ValueError(f"one block of {threads} threads needs more {limiter} than an SM of "
                         f"compute capability {cc[0]}.{cc[1]} has: the launch would fail")
    return Occupancy(blocks, blocks * warps, max_warps, limiter, caps)


# ------------------------------------------------------------------------------------ SASS
def sass(ptx_text: str, cc=(9, 0)) -> str | None:
    """The SASS that ptxas makes of ``ptx_text`` (see :func:`gemm_lessons.compiled.sass`)."""
    from .compiled import sass as _sass
    return _sass(ptx_text, cc)


_OPCODE = re.compile(r"^\s+/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", re.M)


def sass_mix(sass_text: str) -> Counter:
    """How many times each SASS instruction (opcode with its modifiers) appears."""
    return Counter(_OPCODE.findall(sass_text))
