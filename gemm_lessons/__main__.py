"""Command line: ``python -m gemm_lessons info | check | ladder | ptx``.

    python -m gemm_lessons info                          # engine, device, versions
    python -m gemm_lessons check [--kernel NAME ...]     # the shape suite; exit 1 on a failure
    python -m gemm_lessons ladder [--size 4096 8192]     # check, then time against cuBLAS
    python -m gemm_lessons ptx NAME [--cc 90] [--grep wmma] [--resources]

The same commands run as ``gemm-lessons ...`` (the script pip installs). A bad argument
gets one line on stderr and exit code 2; arguments are checked before anything compiles.
"""
from __future__ import annotations

import argparse
import os
import platform
import re
import sys

EXAMPLES = """\
examples:
  gemm-lessons info                                   # engine, device, versions, kernels
  gemm-lessons check --kernel k01_coalesced           # one kernel on the shape suite
  gemm-lessons ladder --size 4096 8192 --csv out.csv  # on a GPU: check, then time vs cuBLAS
  gemm-lessons ptx k01_coalesced --cc 90 --grep ld.global   # PTX, no GPU needed
  gemm-lessons ptx k05_wmma --cc 8.0 --resources      # registers, spills, shared memory
(`python -m gemm_lessons ...` is the same command.)
"""

MAX_SIZE = 65536    # M = N = K beyond this is three 16 GiB fp32 matrices: surely a typo


def _compute_capability(text):
    """'90', '9.0' or 'sm_90' -> (9, 0); anything else is an argparse error."""
    m = re.fullmatch(r"(?:sm_)?(?:(\d{1,2})\.(\d)|(\d{1,2})(\d))a?", text.strip())
    if not m:
        raise argparse.ArgumentTypeError(
            f"expected a compute capability like 90 or 9.0, got {text!r}")
    major, minor = (int(g) for g in (m.groups()[:2] if m.group(1) else m.groups()[2:]))
    if major < 5:
        raise argparse.ArgumentTypeError(
            f"compute capability {major}.{minor} is older than any GPU numba-cuda compiles "
            f"for (5.0 and up), got {text!r}")
    return major, minor


def _regex(text):
    try:
        return re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"not a regular expression: {text!r} ({e})") from None


def _size(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number like 4096, got {text!r}") from None
    if not 1 <= n <= MAX_SIZE:
        raise argparse.ArgumentTypeError(f"expected a size from 1 to {MAX_SIZE}, got {n}")
    return n


class _Parser(argparse.ArgumentParser):
    """argparse, with a bad argument reported on one line (exit code 2), not usage + error."""

    def error(self, message):
        message = message.removeprefix("argument ")
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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
    from gemm_lessons.guard import interactive
    from tqdm.auto import tqdm
    entries = _select(args.kernel)
    failed = 0
    quiet = args.quiet or not interactive()     # no bar written into a log
    print(f"engine: {gl.engine()}")
    for entry in entries:
        try:
            with tqdm(total=9 * len(entry.dtypes), desc=entry.name, leave=False,
                      disable=quiet) as bar:
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
    from gemm_lessons.guard import interactive
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
    with tqdm(total=total, desc="ladder", disable=args.quiet or not interactive()) as bar:
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
        if os.path.exists(args.out):      # nothing is plotted when nothing was timed
            print(f"\nwrote {args.out}")
        if args.csv and any(r.ms is not None for _, r in results):
            from gemm_lessons import results as recorded
            recorded.write_csv(args.csv, [r for _, r in results], [les for les, _ in results],
                               device=gl.engine().device_name, versions=_versions(),
                               keep=args.merge)
            print(f"wrote {args.csv}")
    return 1 if any("skipped" not in f for f in failures) else 0


def cmd_ptx(args):
    import gemm_lessons  # noqa: F401  (decides the engine)
    from gemm_lessons import compiled
    sm = f"{args.cc[0]}{args.cc[1]}"
    try:
        text = compiled.ptx(args.name, args.cc)
    except (ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.resources:
        rep = compiled.ptxas_report(text, args.cc)
        if rep is None:
            print("ptxas not found: pip install 'cuda-toolkit[nvcc]==13.*' "
                  "(or put CUDA's ptxas on PATH)")
        else:
            print(f"{args.name} for sm_{sm}: " + ", ".join(f"{k} {v}" for k, v in rep.items()))
        return 0
    if args.grep:
        lines = [l for l in text.splitlines() if args.grep.search(l)]
        print("\n".join(lines))
        print(f"# {len(lines)} lines match {args.grep.pattern!r}")
        return 0
    sys.stdout.write(text)
    return 0


def parser():
    import gemm_lessons
    ap = _Parser(prog="gemm-lessons", epilog=EXAMPLES,
                 formatter_class=argparse.RawDescriptionHelpFormatter,
                 description="gemm_lessons: check, time and inspect the kernels")
    ap.add_argument("--version", action="version",
                    version=f"gemm_lessons {gemm_lessons.__version__}")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{info,check,ladder,ptx}",
                            parser_class=_Parser)
    sub.add_parser("info", help="engine, device, versions, kernels", epilog=EXAMPLES,
                   formatter_class=argparse.RawDescriptionHelpFormatter)
    p = sub.add_parser("check", help="run the shape suite on this engine", epilog=EXAMPLES,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", nargs="*", help="kernel names (default: all)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (none where stderr is not a terminal)")
    p = sub.add_parser("ladder", help="check, then time every kernel against cuBLAS",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", type=_size, nargs="*",
                   help=f"M = N = K values, 1 to {MAX_SIZE} (default on a GPU: 4096 8192)")
    p.add_argument("--kernel", nargs="*", help="kernel names (default: all)")
    p.add_argument("--all-dtypes", action="store_true", help="time every dtype a kernel takes")
    p.add_argument("--out", default="ladder.png", help="where to write the plot")
    p.add_argument("--csv", help="also write the results as CSV (gemm_lessons.results format)")
    p.add_argument("--merge", action="store_true",
                   help="with --csv: keep the CSV's rows of kernels and sizes this run does "
                        "not measure")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar (none where stderr is not a terminal)")
    p = sub.add_parser("ptx", help="the PTX of a numba kernel (works without a GPU)",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name")
    p.add_argument("--cc", default=(8, 0), type=_compute_capability,
                   help="compute capability, e.g. 90 or 9.0 (default 80)")
    p.add_argument("--grep", type=_regex,
                   help="print only lines matching this regular expression")
    p.add_argument("--resources", action="store_true", help="registers, spills, shared memory")
    return ap


def _validate(args):
    """What argparse cannot see: kernel names, a numba kernel for ptx, output folders.
    Returns the one-line complaint, or None."""
    from gemm_lessons import registry
    known = registry.names()
    for name in (getattr(args, "kernel", None) or []) + ([args.name] if args.cmd == "ptx" else []):
        if name not in known:
            return f"unknown kernel {name!r}; known kernels: {', '.join(known)}"
    if args.cmd == "ptx":
        entry = registry.get(args.name)
        if entry.ptx is None:       # said before any compiler or child process starts
            numba_names = ", ".join(k.name for k in registry.entries() if k.ptx is not None)
            return (f"{entry.name} is a {entry.language} kernel: it has no numba PTX (a Triton "
                    f"kernel shows its own through kernel.asm on a GPU); numba kernels: "
                    f"{numba_names}")
    if args.cmd == "ladder":
        for opt, path in (("--out", args.out), ("--csv", args.csv)):
            if path and not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                return f"{opt}: no such folder for {path!r}"
    return None


def _run(argv):
    ap = parser()
    args = ap.parse_args(argv)
    problem = _validate(args)
    if problem:
        ap.exit(2, f"{ap.prog} {args.cmd}: error: {problem}\n")
    return {"info": cmd_info, "check": cmd_check, "ladder": cmd_ladder,
            "ptx": cmd_ptx}[args.cmd](args)


def main(argv=None):
    """Entry point of ``python -m gemm_lessons`` and of the ``gemm-lessons`` script."""
    try:
        rc = _run(argv)
        sys.stdout.flush()
        return rc
    except BrokenPipeError:
        # `gemm-lessons info | head -1`: the reader left. Point stdout at /dev/null so that
        # the interpreter's last flush at exit does not complain, and end quietly.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
