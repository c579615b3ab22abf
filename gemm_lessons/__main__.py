"""Command line: ``python -m gemm_lessons info | check | ladder | ptx``.

    python -m gemm_lessons info                          # engine, device, versions
    python -m gemm_lessons check [--kernel NAME ...]     # the shape suite; exit 1 on a failure
    python -m gemm_lessons ladder [--size 4096 8192]     # check, then time against cuBLAS
    python -m gemm_lessons ptx NAME [--cc 90] [--grep wmma] [--resources]
"""
from __future__ import annotations

import argparse
import platform
import sys


def _versions():
    from importlib import metadata
    out = {"python": platform.python_version()}
    for pkg in ("torch", "triton", "numba", "numba-cuda", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def cmd_info(args):
    import gemm_lessons as gl
    print(f"engine: {gl.engine()}")
    for k, v in _versions().items():
        print(f"{k}: {v}")
    print(f"kernels: {len(gl.kernels())} registered")
    for k in gl.kernels():
        print(f"  {k.name:<24} lesson {k.lesson:02d}  {k.language:<6} "
              f"{'/'.join(k.dtype_names):<16} {k.summary}")
    return 0


def _select(names):
    import gemm_lessons as gl
    from gemm_lessons import registry
    if not names:
        return [k for k in gl.kernels()]
    return [registry.get(n) for n in names]


def cmd_check(args):
    import gemm_lessons as gl
    from gemm_lessons.harness import CheckError
    from tqdm.auto import tqdm
    try:
        entries = _select(args.kernel)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    failed = 0
    print(f"engine: {gl.engine()}")
    for entry in entries:
        try:
            with tqdm(total=9 * len(entry.dtypes), desc=entry.name, leave=False,
                      disable=args.quiet) as bar:
                report = gl.check(entry.name, progress=bar.update)
            print(report)
        except CheckError as e:
            failed += 1
            print(f"FAILED {e}")
        except gl.UnsupportedDevice as e:
            print(f"skipped {entry.name}: {e}")
    if failed:
        print(f"{failed} kernel(s) failed")
    return 1 if failed else 0


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def ladder_table(results):
    """The ladder as a markdown table (the README's results table)."""
    lines = ["| kernel | lesson | dtype | M=N=K | ms | TFLOP/s | cuBLAS TFLOP/s | ratio |",
             "|---|---|---|---|---|---|---|---|"]
    for lesson, r in results:
        dt = str(r.dtype).replace("torch.", "")
        lines.append(f"| {r.kernel} | {lesson:02d} | {dt} | {r.M} | {_fmt(r.ms, '.3f')} | "
                     f"{_fmt(r.tflops, '.1f')} | {_fmt(r.baseline_tflops, '.1f')} | "
                     f"{_fmt(r.ratio, '.2f')} |")
    return "\n".join(lines)


def cmd_ladder(args):
    import torch
    import gemm_lessons as gl
    from gemm_lessons import engines, harness
    from gemm_lessons.harness import CheckError
    from tqdm.auto import tqdm
    entries = [e for e in _select(args.kernel) if e.in_ladder or args.kernel]
    gpu = engines.on_gpu()
    sizes = args.size or ([4096, 8192] if gpu else [])
    print(f"engine: {gl.engine()}")
    print("versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()))
    if not gpu:
        print("No GPU: every kernel is checked on the simulator; " + harness.SIMULATOR_NOTE + ".")
    jobs = []
    for e in entries:
        dts = e.dtypes if args.all_dtypes else e.dtypes[:1]
        jobs.append((e, dts))
    total = sum(1 + len(dts) * len(sizes) for _, dts in jobs)
    results, failures = [], []
    with tqdm(total=total, desc="ladder", disable=args.quiet) as bar:
        for e, dts in jobs:
            bar.set_postfix_str(f"check {e.name}")
            try:
                gl.check(e.name)
            except gl.UnsupportedDevice as err:
                failures.append(f"{e.name}: skipped ({err})")
                bar.update(1 + len(dts) * len(sizes))
                continue
            except Exception as err:  # a wrong result or a kernel that does not build/run
                kind = "" if isinstance(err, CheckError) else f"{type(err).__name__}: "
                failures.append(f"{e.name}: {kind}{str(err)[:2000]}")
                bar.update(1 + len(dts) * len(sizes))
                continue
            bar.update(1)
            for dt in dts:
                for n in sizes:
                    bar.set_postfix_str(f"{e.name} {str(dt).replace('torch.', '')} {n}")
                    try:
                        r = gl.bench(e.name, n, dtype=dt)   # cuBLAS timed beside it
                    except Exception as err:
                        failures.append(f"{e.name}: timing at {n} failed: "
                                        f"{type(err).__name__}: {str(err)[:500]}")
                        bar.update(1)
                        continue
                    results.append((e.lesson, r))
                    tqdm.write(str(r))
                    bar.update(1)
    for e, _ in jobs:
        if not any(f.startswith(e.name + ":") for f in failures):
            print(f"{e.name}: correct on the shape suite")
    for f in failures:
        print(f"FAILED {f}")
    if results:
        print()
        print(ladder_table(results))
        from gemm_lessons import plots
        plots.ladder_plot([r for _, r in results], args.out,
                          title=f"gemm_lessons ladder on {gl.engine().device_name}")
        print(f"\nwrote {args.out}")
        if args.csv:
            from gemm_lessons import results as recorded
            recorded.write_csv(args.csv, [r for _, r in results], [les for les, _ in results],
                               device=gl.engine().device_name, versions=_versions())
            print(f"wrote {args.csv}")
    return 1 if any("skipped" not in f for f in failures) else 0


def cmd_ptx(args):
    import gemm_lessons  # noqa: F401  (decides the engine)
    from gemm_lessons import compiled
    try:
        text = compiled.ptx(args.name, args.cc)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.resources:
        rep = compiled.ptxas_report(text, args.cc)
        if rep is None:
            print("ptxas not found: install numba-cuda[cu12] (or put CUDA's ptxas on PATH)")
        else:
            print(f"{args.name} for sm_{args.cc}: " + ", ".join(f"{k} {v}" for k, v in rep.items()))
        return 0
    if args.grep:
        import re
        pat = re.compile(args.grep)
        lines = [l for l in text.splitlines() if pat.search(l)]
        print("\n".join(lines))
        print(f"# {len(lines)} lines match {args.grep!r}")
        return 0
    sys.stdout.write(text)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m gemm_lessons",
                                 description="gemm_lessons: check, time and inspect the kernels")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="engine, device, versions, kernels")
    p = sub.add_parser("check", help="run the shape suite on this engine")
    p.add_argument("--kernel", nargs="*", help="kernel names (default: all)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p = sub.add_parser("ladder", help="check, then time every kernel against cuBLAS")
    p.add_argument("--size", type=int, nargs="*", help="M = N = K values (default 4096 8192)")
    p.add_argument("--kernel", nargs="*", help="kernel names (default: all)")
    p.add_argument("--all-dtypes", action="store_true", help="time every dtype a kernel takes")
    p.add_argument("--out", default="ladder.png", help="where to write the plot")
    p.add_argument("--csv", help="also write the results as CSV (gemm_lessons.results format)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p = sub.add_parser("ptx", help="the PTX of a numba kernel (works without a GPU)")
    p.add_argument("name")
    p.add_argument("--cc", default="80", help="compute capability, e.g. 80 or 90")
    p.add_argument("--grep", help="print only lines matching this regular expression")
    p.add_argument("--resources", action="store_true", help="registers, spills, shared memory")
    args = ap.parse_args(argv)
    return {"info": cmd_info, "check": cmd_check, "ladder": cmd_ladder, "ptx": cmd_ptx}[args.cmd](args)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:          # `python -m gemm_lessons info | head`: the reader left
        sys.stderr.close()
        sys.exit(0)
