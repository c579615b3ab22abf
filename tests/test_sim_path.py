"""The simulator runs the code path the GPU runs: for every registered kernel that picks its
configuration by engine, the two configurations differ in sizes only.

A kernel declares what each engine runs in ``Kernel.configs = {"gpu": ..., "simulator":
...}`` (see :class:`gemm_lessons.kernels.Kernel`). The rule, the same for every family:

* both sides have the same parameter names (a dict's keys, a dataclass's fields, a
  namedtuple's fields, a ``triton.Config``'s meta-parameters plus ``num_warps`` and
  ``num_stages``);
* every parameter that is not an integer - a flag, a layout or precision name, None - is
  equal on both sides: those are the ones that change which loop runs;
* integers (tile sizes, warps, stages, group sizes) are positive and may differ.

Where the GPU picks among several configurations (a list, or a dict by dtype: autotuning,
one tile per precision), each of them is held to the rule against the simulator's.

And a kernel module that defines engine-dependent configurations (``GPU_CONFIG``,
``SIM_CONFIG``, ``SIMULATOR_CONFIG``, ``INTERPRETER_CONFIG`` and the like) must declare
them, so that no registered kernel escapes the rule.
"""
import gemm_lessons as gl  # noqa: F401,I001  (first: it picks the engine)
import dataclasses
import importlib
import re

import pytest
import torch

from gemm_lessons import registry

ENGINE_CONFIG = re.compile(r"^(GPU|SIM|SIMULATOR|INTERPRETER)_CONFIGS?$")
PENDING = ()


def params(cfg):
    """A configuration as {parameter: value}."""
    if isinstance(cfg, dict):
        return dict(cfg)
    if dataclasses.is_dataclass(cfg):
        return dataclasses.asdict(cfg)
    if hasattr(cfg, "_asdict"):
        return dict(cfg._asdict())
    if hasattr(cfg, "kwargs") and hasattr(cfg, "num_warps"):          # triton.Config
        return dict(cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    raise TypeError(f"cannot read the parameters of {cfg!r}")


def gpu_choices(gpu):
    """The GPU's configurations: one, a list, or a dict from torch dtype to one."""
    if isinstance(gpu, (list, tuple)) and not hasattr(gpu, "_asdict"):
        return list(gpu)
    if isinstance(gpu, dict) and gpu and all(isinstance(k, torch.dtype) for k in gpu):
        return list(gpu.values())
    return [gpu]


def differences(gpu, sim):
    """What other than sizes differs between a GPU and a simulator configuration."""
    g, s = params(gpu), params(sim)
    out = []
    if set(g) != set(s):
        out.append(f"parameters {sorted(set(g) ^ set(s))} exist on one side only")
    for k in sorted(set(g) & set(s)):
        a, b = g[k], s[k]
        if isinstance(a, int) and not isinstance(a, bool) and isinstance(b, int) \
                and not isinstance(b, bool):
            if a < 1 or b < 1:
                out.append(f"{k} must be a positive size, got {a} (gpu) and {b} (simulator)")
        elif a != b:
            out.append(f"{k} is {a!r} on the GPU but {b!r} on the simulator")
    return out


ENTRIES = registry.entries()


def test_the_rule_tells_a_structure_flag_from_a_size():
    # guards the test itself: a flag or a missing parameter is caught, a size is not
    assert differences(dict(BM=128, STAGES=3), dict(BM=16, STAGES=2)) == []
    assert differences(dict(BM=128, PREFETCH=True), dict(BM=16, PREFETCH=False))
    assert differences(dict(BM=128, PREFETCH=True), dict(BM=16))
    assert differences(dict(layout="row"), dict(layout="col"))


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_the_simulator_runs_the_gpu_loop_with_smaller_sizes(entry):
    if not entry.simulator:
        assert entry.configs is None or "simulator" not in entry.configs, entry.name
        return                             # GPU only (Gluon): no simulator loop to compare
    module_name = entry.launch.__module__
    module = importlib.import_module(module_name)
    defined = sorted(n for n in vars(module) if ENGINE_CONFIG.match(n))
    if entry.configs is None:
        if defined and module_name.startswith(PENDING):
            pytest.skip(f"{entry.name}: Kernel.configs to be declared by its module's owner")
        assert not defined, (f"{entry.name}: its module defines {defined} but the kernel "
                             "declares no configs={'gpu': ..., 'simulator': ...}")
        return
    assert set(entry.configs) == {"gpu", "simulator"}, entry.configs.keys()
    sim = entry.configs["simulator"]
    problems = {str(g): differences(g, sim) for g in gpu_choices(entry.configs["gpu"])}
    problems = {g: p for g, p in problems.items() if p}
    assert not problems, f"{entry.name}: the simulator runs another loop than the GPU: {problems}"
