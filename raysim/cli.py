"""The `raysim` command: run, validate, list, data info, report, compare.

Exit codes: 0 success; 2 invalid input (scenario, override, missing data); 1 failure during the
run; 130 interrupted.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import traceback
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):          # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        print(f"raysim: error: {message}", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raysim", description="Federated-learning simulator on Ray.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    r = sub.add_parser("run", help="run a scenario end to end")
    r.add_argument("file", help="scenario YAML")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set algorithm.lr=0.01 --set rounds=5")
    r.add_argument("--address", default=None,
                   help="join a Ray cluster ('auto' or HOST:PORT); default: start a local Ray")
    r.add_argument("--engine", choices=("ray", "serial"), default="ray",
                   help="ray (default) or serial: every host in this process, the reference engine")
    r.add_argument("--summary", default=None, metavar="PATH", help="write the run summary as JSON")
    r.add_argument("--resume", default=None, metavar="RUN_ID",
                   help="continue the MLflow run RUN_ID from its last checkpoint")
    r.add_argument("--variant", default=None, metavar="NAME",
                   help="run only this variant of a sweep file (needed with --resume)")
    r.add_argument("--seeds", default=None, metavar="LIST",
                   help="run each variant once per seed, e.g. 0,1,2 (or the file's seeds: [0, 1, 2]); the runs "
                        "are nested under one parent MLflow run and compared at the end")
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.add_argument("-v", "--verbose", action="store_true", help="show Ray's logs and tracebacks")
    v = sub.add_parser("validate", help="check a scenario without running it")
    v.add_argument("file")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    v.add_argument("--variant", default=None, metavar="NAME")
    sub.add_parser("list", help="algorithms, datasets, models and partitioners")
    d = sub.add_parser("data", help="look at a scenario's data")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    i = dsub.add_parser("info", help="clients, split sizes and label histograms of a scenario's data")
    i.add_argument("file", help="scenario YAML")
    i.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    i.add_argument("--variant", default=None, metavar="NAME")
    i.add_argument("--plot", nargs="?", const="", default=None, metavar="PNG",
                   help="also draw sizes and label distributions into PNG (default: <scenario name>-data.png)")
    i.add_argument("--show", type=int, default=10, metavar="N", help="clients listed one per line (default 10)")
    rp = sub.add_parser("report", help="figures of finished runs, written to a folder and logged to MLflow")
    rp.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    rp.add_argument("--tracking-uri", default=None, help="MLflow store (default MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    rp.add_argument("--out", default="report", help="folder for the figures (default ./report; one subfolder per run)")
    rp.add_argument("--no-log", action="store_true", help="do not log the figures to the runs")
    cp = sub.add_parser("compare", help="finished runs as one table (method x dataset, mean ± std over seeds)")
    cp.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs (a sweep's parent stands for its runs)")
    cp.add_argument("--experiment", default=None, metavar="NAME", help="every finished run of this MLflow experiment")
    cp.add_argument("--tracking-uri", default=None, help="MLflow store (default MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
    cp.add_argument("--out", default="report", help="folder for compare.md and compare.csv (default ./report)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except SystemExit:
        raise
    except BaseException as e:          # noqa: BLE001 - map every error to an exit code
        return _report(e, getattr(args, "verbose", False))


def _dispatch(args) -> int:
    from raysim import config
    if args.command == "list":
        from raysim.setup import describe_registries
        for section, items in describe_registries():
            print(f"{section}:")
            width = max(len(n) for n, _ in items)
            for name, summary in items:
                print(f"  {name:<{width}}  {summary}")
        return EXIT_OK
    if args.command == "report":
        from raysim.report import report
        made = report(args.run_ids, args.tracking_uri, args.out, log=not args.no_log)
        for run_id, paths in made.items():
            print(f"{run_id}: {', '.join(str(p) for p in paths) or 'no figure (nothing evaluated)'}")
        return EXIT_OK
    if args.command == "compare":
        from raysim.compare import compare
        text, md, cv = compare(args.run_ids, args.experiment, args.tracking_uri, args.out)
        print(text)
        print(f"written to {md} and {cv}")
        return EXIT_OK
    seeds = config.seeds_of(args.file, getattr(args, "seeds", None)) if args.command == "run" else None
    variants = config.load_variants(args.file, args.overrides, args.variant, seeds=seeds)
    if args.command == "data":
        from raysim.data import info
        for variant, sc in variants:
            found = info.describe(sc.data.dataset.name, config.make_source(sc))
            print(info.text(found, args.show))
            if args.plot is not None:
                path = args.plot or f"{sc.name}-data.png"
                info.plot(found, path)
                print(f"figure written to {path}")
        return EXIT_OK
    if args.command == "validate":
        for variant, sc in variants:
            label = f" [{variant}]" if variant else ""
            print(f"{args.file}{label}: ok ({sc.algorithm.name} on {sc.data.dataset.name}, "
                  f"{sc.data.clients} clients, {sc.rounds} rounds)")
        return EXIT_OK
    if args.resume and len(variants) > 1:
        raise config.ScenarioError(f"{args.file}: --resume continues one run; add --variant NAME"
                                   + (" and --seeds SEED" if seeds else ""))
    from raysim.run import run
    summaries = {}
    parent = None
    if len(variants) > 1 and not args.resume:        # a sweep or seeded runs: nested under one parent
        from raysim import tracking
        name = f"{Path(args.file).stem}" + (f" seeds {','.join(map(str, seeds))}" if seeds else "")
        parent = tracking.start_parent(variants[0][1], name, [(v, sc.seed) for v, sc in variants])
    ok = False
    try:
        for variant, sc in variants:
            tags = {"variant": variant} if variant else {}
            if parent is not None:
                tags["mlflow.parentRunId"] = parent[1]
            summary = run(sc, engine=args.engine, address=args.address, resume=args.resume,
                          summary_path=None if len(variants) > 1 else args.summary, verbose=args.verbose,
                          progress=not args.quiet, resume_command=_resume_command(args, variant, sc.seed if seeds else None),
                          tags=tags)
            summaries[variant if not seeds else f"{variant or sc.name} seed {sc.seed}"] = summary
            shown = ", ".join(f"{k} {v:.4f}" for k, v in summary["final"].items() if isinstance(v, float))
            print(f"{sc.name}: {summary['rounds']} rounds in {summary['wall_seconds']:.1f}s; {shown}")
            print(f"MLflow run {summary['mlflow_run_id']} recorded in {summary['tracking_uri']} "
                  f"(experiment '{sc.tracking.experiment}'); view it with: mlflow ui --backend-store-uri "
                  f"{summary['tracking_uri']}")
        ok = True
    finally:
        if parent is not None:
            parent[0].set_terminated(parent[1], "FINISHED" if ok else "FAILED")
    if len(variants) > 1:
        _print_sweep(summaries)
        if args.summary:
            Path(args.summary).write_text(json.dumps({"sweep": args.file, "variants": summaries}, indent=2))
        if parent is not None:
            from raysim.compare import table
            print(table(parent[0], [parent[1]])[0])
            print(f"parent MLflow run {parent[1]}: raysim compare {parent[1]}  /  raysim report {parent[1]}"
                  + (f"  (with --tracking-uri {summaries[next(iter(summaries))]['tracking_uri']})"
                     if variants[0][1].tracking.uri else ""))
    return EXIT_OK


def _resume_command(args, variant: str | None, seed: int | None = None) -> str:
    """The command that continues this run, with ``{run_id}`` to fill in."""
    parts = ["raysim", "run", args.file]
    if variant is not None:
        parts += ["--variant", variant]
    if seed is not None:
        parts += ["--seeds", str(seed)]
    for item in args.overrides:
        parts += ["--set", item]
    if args.engine != "ray":
        parts += ["--engine", args.engine]
    if args.address:
        parts += ["--address", args.address]
    return shlex.join(parts) + " --resume {run_id}"


def _print_sweep(summaries: dict) -> None:
    keys = ["accuracy", "bottom_decile_accuracy", "global_accuracy", "consensus_distance"]
    keys = [k for k in keys if any(k in s["final"] or k in s["history"][-1] for s in summaries.values())]
    width = max(len(str(v)) for v in summaries)
    print(f"{'variant':<{width}}  " + "  ".join(f"{k:>22}" for k in keys) + f"  {'seconds':>8}")
    for variant, s in summaries.items():
        vals = [s["final"].get(k, s["history"][-1].get(k)) for k in keys]
        print(f"{variant:<{width}}  " + "  ".join(f"{v:22.4g}" if v is not None else f"{'-':>22}" for v in vals)
              + f"  {s['wall_seconds']:8.1f}")


def _report(e: BaseException, verbose: bool) -> int:
    from raysim.config import ScenarioError
    from raysim.data import DataError
    if isinstance(e, KeyboardInterrupt):
        print("raysim: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    from raysim.compare import CompareError
    from raysim.report import ReportError
    if isinstance(e, (ScenarioError, DataError, ReportError, CompareError)):
        print(f"raysim: {e}", file=sys.stderr)
        return EXIT_INPUT
    cause = _root_cause(e)
    if isinstance(cause, (ScenarioError, DataError)):
        print(f"raysim: {cause}", file=sys.stderr)
        return EXIT_INPUT
    if verbose:
        traceback.print_exception(e)
    msg = str(cause).strip().splitlines()
    print(f"raysim: run failed: {type(cause).__name__}: {msg[-1] if msg else ''}"
          + ("" if verbose else " (rerun with -v for the traceback)"), file=sys.stderr)
    return EXIT_FAILED


def _root_cause(e: BaseException) -> BaseException:
    """Unwrap Ray's task errors to the user's exception where Ray keeps it."""
    inner = getattr(e, "cause", None)
    if isinstance(inner, BaseException):
        return _root_cause(inner)
    return e


def entry() -> None:
    """The console command: ``main``, then a quick exit. Ray's own exit hook pauses half a
    second before stopping a local Ray, which stops its processes one by one, and unloading
    torch, Ray and MLflow takes seconds more; every result is written by then (MLflow calls are
    synchronous), so raysim stops Ray itself (``stop_for_exit``) and leaves without the
    interpreter's teardown."""
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    if "raysim.engine.ray_engine" in sys.modules:
        from raysim.engine import ray_engine
        ray_engine.stop_for_exit()
    os._exit(rc)


if __name__ == "__main__":
    entry()
