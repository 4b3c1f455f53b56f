"""The `raysim` command: run, validate, list, data info, report, compare.

Exit codes: 0 success; 2 invalid input (scenario, override, missing data, an unreachable
tracking store, unwritable output, or a Ray cluster that --address cannot join without its
token); 1 failure during the run; 130 interrupted (Ctrl-C); 143
terminated (SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import sys

from raysim.errors import EXIT_FAILED, EXIT_INPUT, EXIT_OK, explain


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: one line, exit 2
        self.print_usage(sys.stderr)
        print(f"raysim: error: {message}", file=sys.stderr)
        sys.exit(EXIT_INPUT)


def parse_run_id(text: str) -> str:
    """``--resume``'s run id (and the Python API's ``resume``): not empty, stripped."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty run id; give the id of the MLflow run to continue")
    return text.strip()


def parse_run_ids(text: str) -> str:
    """``--best-of``'s comma-separated parent run ids (and the Python API's ``best_of``)."""
    ids = [t.strip() for t in text.split(",")]
    if not all(ids):
        raise argparse.ArgumentTypeError(f"{text!r}: give sweep parent run ids, separated by commas")
    return ",".join(ids)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="raysim", description="Federated-learning simulator on Ray.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_run(sub)
    _add_validate(sub)
    _add_list(sub)
    _add_data(sub)
    _add_report(sub)
    _add_compare(sub)
    return p


def _add_overrides(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--set KEY=VALUE``, repeatable (run, validate, data info)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=help_text)


def _add_tracking_uri(parser: argparse.ArgumentParser) -> None:
    """``--tracking-uri`` of the commands that read finished runs (report, compare)."""
    parser.add_argument(
        "--tracking-uri", default=None, help="MLflow store (default MLFLOW_TRACKING_URI or sqlite:///mlflow.db)"
    )


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="run a scenario end to end")
    r.add_argument("file", help="scenario YAML")
    _add_overrides(r, "override a scenario key, e.g. --set algorithm.lr=0.01 --set rounds=5")
    r.add_argument(
        "--address", default=None, help="join a Ray cluster ('auto' or HOST:PORT); default: start a local Ray"
    )
    r.add_argument(
        "--engine",
        choices=("ray", "serial"),
        default="ray",
        help="ray (default) or serial: every host in this process, the reference engine",
    )
    r.add_argument("--summary", default=None, metavar="PATH", help="write the run summary as JSON")
    r.add_argument(
        "--resume",
        default=None,
        metavar="RUN_ID",
        type=parse_run_id,
        help="continue the MLflow run RUN_ID from its last checkpoint; with a sweep (or --seeds), RUN_ID "
        "is its parent run: finished runs are kept, the others continue, the unstarted start",
    )
    _add_run_sweep_options(r)
    r.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    r.add_argument("-v", "--verbose", action="store_true", help="show Ray's logs and tracebacks")


def _add_run_sweep_options(r: argparse.ArgumentParser) -> None:
    """``run``'s options that choose and pace the runs of a sweep or of seeds."""
    r.add_argument(
        "--variant",
        default=None,
        metavar="NAME",
        help="run only this variant of a sweep file, or the variants a shell pattern matches "
        "('*-shards,lr=0.01'); with --resume of one run, its variant",
    )
    r.add_argument(
        "--seeds",
        default=None,
        metavar="LIST",
        help="run each variant once per seed, e.g. 0,1,2 (or the file's seeds: [0, 1, 2]); the runs "
        "are nested under one parent MLflow run and compared at the end",
    )
    r.add_argument(
        "--best-of",
        default=None,
        metavar="PARENT_ID",
        type=parse_run_ids,
        help="of a sweep file's variants, run only those the sweep PARENT_ID chose on validation (per "
        "method and dataset, the grid point of best mean val_accuracy or val_mse over its seeds; "
        "several parents, comma-separated, choose together): tune a grid at one seed, then repeat "
        "its chosen points at others",
    )
    r.add_argument(
        "--concurrent",
        type=_positive,
        default=None,
        metavar="N",
        help="a sweep's or seeds' runs at once, side by side on Ray Tune (default: as many as the "
        "cluster holds; 1: one after another in this process)",
    )


def _add_validate(sub) -> None:
    v = sub.add_parser("validate", help="check a scenario without running it")
    v.add_argument("file", help="scenario YAML (a sweep file: each of its variants is checked)")
    _add_overrides(v, "override a scenario key before checking, as run's --set, e.g. --set data.clients=100")
    v.add_argument(
        "--variant",
        default=None,
        metavar="NAME",
        help="check only this variant of a sweep file (default: every variant)",
    )


def _add_list(sub) -> None:
    sub.add_parser(
        "list",
        help="algorithms, datasets, models and partitioners, each with its source "
        "(built-in, or the plugin's distribution)",
    )


def _add_data(sub) -> None:
    d = sub.add_parser("data", help="look at a scenario's data")
    dsub = d.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    _add_data_fedscale(dsub)
    _add_data_info(dsub)


def _add_data_fedscale(dsub) -> None:
    fs = dsub.add_parser(
        "fedscale",
        help="FedScale's device and availability traces (pickles, read as plain data, "
        "never unpickled) as raysim's CSV traces for the systems section",
    )
    fs.add_argument("--devices", default=None, metavar="FILE", help="FedScale's client_device_capacity")
    fs.add_argument("--availability", default=None, metavar="FILE", help="FedScale's client_behave_trace")
    fs.add_argument("--clients", type=int, required=True, help="raysim's clients 0..N-1, from the traces' first N ids")
    fs.add_argument("--out", default="traces", help="folder for devices.csv and windows.csv (default ./traces)")
    fs.add_argument(
        "--repeat",
        choices=("client", "global"),
        default="client",
        help="client (default, as FedScale): each client's availability repeats with its own "
        "finish_time (windows.csv's period_s column); global: every trace repeats with the "
        "scenario's systems.period_s",
    )


def _add_data_info(dsub) -> None:
    i = dsub.add_parser("info", help="clients, split sizes and label histograms of a scenario's data")
    i.add_argument("file", help="scenario YAML (a sweep file: each of its variants' data in turn)")
    _add_overrides(i, "override a scenario key first, as run's --set, e.g. --set data.partition.alpha=0.1")
    i.add_argument(
        "--variant", default=None, metavar="NAME", help="only this variant of a sweep file (default: every variant)"
    )
    i.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        metavar="PNG",
        help="also draw sizes and label distributions into PNG (default: <scenario name>-data.png)",
    )
    i.add_argument("--show", type=int, default=10, metavar="N", help="clients listed one per line (default 10)")


def _add_report(sub) -> None:
    rp = sub.add_parser("report", help="figures of finished runs, written to a folder and logged to MLflow")
    rp.add_argument(
        "run_ids",
        nargs="+",
        metavar="RUN_ID",
        help="finished MLflow runs (a parent, of a sweep or of seeds, stands for its runs; several "
        "also get a comparison figure)",
    )
    _add_tracking_uri(rp)
    rp.add_argument("--out", default="report", help="folder for the figures (default ./report; one subfolder per run)")
    rp.add_argument("--no-log", action="store_true", help="do not log the figures to the runs")


def _add_compare(sub) -> None:
    cp = sub.add_parser(
        "compare", help="finished runs as one table (method x dataset, mean ± std over seeds or clients)"
    )
    cp.add_argument("run_ids", nargs="*", metavar="RUN_ID", help="runs (a sweep's parent stands for its runs)")
    cp.add_argument("--experiment", default=None, metavar="NAME", help="every finished run of this MLflow experiment")
    _add_tracking_uri(cp)
    cp.add_argument("--out", default="report", help="folder for compare.md and compare.csv (default ./report)")
    cp.add_argument(
        "--metrics",
        default=None,
        metavar="M1,M2",
        help="columns: metrics the runs logged, e.g. accuracy,top5_accuracy,ece,test_loss,"
        "global_accuracy,best_accuracy (default: accuracy, or mse)",
    )
    cp.add_argument(
        "--over",
        default="seeds",
        choices=("seeds", "clients"),
        help="± the std over seeds (default) or over clients (as the papers; averaged over seeds)",
    )
    cp.add_argument(
        "--select",
        default=None,
        metavar="VAL_METRIC",
        help="per method and dataset, show only the sweep variant whose mean of this validation "
        "metric over its seeds is best (e.g. val_accuracy; best_val_accuracy with --metrics "
        "test_at_val_best_accuracy picks the round too), named in each cell",
    )
    cp.add_argument(
        "--rank",
        default=None,
        metavar="METRIC",
        help="order the methods best first by this metric, one of --metrics (e.g. "
        "target_virtual_hours: time-to-accuracy on a simulated fleet, lowest first; a method "
        "that never reached the target last)",
    )


def main(argv: list[str] | None = None, early_ray: bool = False) -> int:
    """The command; ``early_ray`` (the console command): ``run`` starts Ray while it
    validates the scenario (a process that goes on after a refusal should not)."""
    args = build_parser().parse_args(argv)
    from raysim.signals import forward_sigterm

    forward_sigterm()
    try:
        return _dispatch(args, early_ray)
    except SystemExit as e:  # raysim's own exits are argparse's, above: this one is the code it ran
        print(
            f"raysim: {args.command} failed: SystemExit: sys.exit({e.code!r}) was called while it ran "
            "(by a plugin, or a library one calls); what it did is not finished",
            file=sys.stderr,
        )
        return EXIT_FAILED
    except BaseException as e:  # noqa: BLE001 - map every error to an exit code
        return _report(e, getattr(args, "verbose", False))


def _dispatch(args, early_ray: bool = False) -> int:
    """The command's handler; ``run`` first checks its scenario and gets MLflow and Ray going."""
    if args.command == "run":
        _prepare_run(args, early_ray)
    return _COMMANDS[args.command](args)


def _prepare_run(args, early_ray: bool) -> None:
    """``run`` before its scenario is loaded: the quick checks (``preflight``), MLflow's
    helper process started while the rest loads, and with ``early_ray`` Ray started in the
    background."""
    from raysim.experiment.preflight import check_run

    actors = check_run(args.file, args.overrides, args.summary, args.resume)
    # MLflow imported by a helper while this one loads (the run tracks there: runner._tracks_in_helper)
    from raysim.results import tracker_process

    tracker_process.prestart()
    if early_ray and args.engine == "ray":
        from raysim.engine import ray_start

        print(
            f"raysim: {'joining Ray at ' + args.address if args.address else 'starting a local Ray instance'} ...",
            file=sys.stderr,
            flush=True,
        )
        ray_start.start_in_background(args.address, args.verbose, actors if args.address is None else 0)


def _cmd_run(args) -> int:
    from raysim.scenario import config

    seeds = config.seeds_of(args.file, args.seeds)
    variants = config.load_variants(args.file, args.overrides, args.variant, seeds=seeds)
    from raysim.experiment.sweep import best_of, run_command

    if args.best_of:
        variants = best_of(args.file, variants, args.best_of, args.variant, args.verbose)
    run_command(
        args.file,
        variants,
        seeds,
        overrides=args.overrides,
        engine=args.engine,
        address=args.address,
        resume=args.resume,
        summary=args.summary,
        verbose=args.verbose,
        progress=not args.quiet,
        concurrent=args.concurrent,
        pattern=args.variant,
        tuned_by=args.best_of,
    )
    return EXIT_OK


def _cmd_validate(args) -> int:
    from raysim.scenario import config

    for variant, sc in config.load_variants(args.file, args.overrides, args.variant, seeds=None):
        label = f" [{variant}]" if variant else ""
        print(
            f"{args.file}{label}: ok ({sc.algorithm.name} on {sc.data.dataset.name}, "
            f"{sc.data.clients} clients, {sc.rounds} rounds)"
        )
    return EXIT_OK


def _cmd_list(args) -> int:
    from raysim.scenario.build import describe_registries

    sections = describe_registries()
    width = max(len(n) for _, items in sections for n, _, _ in items)
    origin = max(len(w) for _, items in sections for _, w, _ in items)
    for section, items in sections:
        print(f"{section}:")
        for name, where, summary in items:
            print(f"  {name:<{width}}  {where:<{origin}}  {summary}")
    return EXIT_OK


def _cmd_data(args) -> int:
    return _fedscale(args) if args.data_command == "fedscale" else _data_info(args)


def _data_info(args) -> int:
    from raysim.data import info
    from raysim.scenario import config

    variants = config.load_variants(args.file, args.overrides, args.variant, seeds=None)
    for _, sc in variants:
        found = info.describe(sc.data.dataset.name, config.make_source(sc))
        print(info.text(found, args.show))
        if args.plot is not None:
            path = args.plot or f"{sc.name}-data.png"
            info.plot(found, path)
            print(f"figure written to {path}")
    return EXIT_OK


def _check_tracking_uri(args) -> None:
    """``report`` and ``compare``: a ``--tracking-uri`` MLflow cannot open is refused first."""
    if args.tracking_uri is None:
        return
    from raysim.scenario.config import ScenarioError
    from raysim.scenario.stores import unknown_store

    if unknown := unknown_store(args.tracking_uri):
        raise ScenarioError(f"{args.command} --tracking-uri: {unknown}")


def _cmd_report(args) -> int:
    _check_tracking_uri(args)
    from raysim.results.report import report

    made = report(args.run_ids, args.tracking_uri, args.out, log=not args.no_log)
    for run_id, paths in made.items():
        print(f"{run_id}: {', '.join(str(p) for p in paths) or 'no figure (nothing evaluated)'}")
    return EXIT_OK


def _cmd_compare(args) -> int:
    _check_tracking_uri(args)
    from raysim.results.compare import compare

    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] if args.metrics else None
    text, md, cv = compare(
        args.run_ids, args.experiment, args.tracking_uri, args.out, metrics, args.over, args.select, args.rank
    )
    print(text)
    print(f"written to {md} and {cv}")
    return EXIT_OK


_COMMANDS = {
    "run": _cmd_run,
    "validate": _cmd_validate,
    "list": _cmd_list,
    "data": _cmd_data,
    "report": _cmd_report,
    "compare": _cmd_compare,
}


def _fedscale(args) -> int:
    from raysim.federation import traces

    if args.devices is None and args.availability is None:
        raise traces.TraceError("raysim data fedscale: give --devices, --availability or both")
    if args.clients < 1:
        raise traces.TraceError(f"raysim data fedscale: --clients {args.clients}: give at least 1")
    tables = {}
    if args.devices is not None:
        tables["devices.csv"] = traces.device_rows(args.devices, args.clients)
    if args.availability is not None:
        tables["windows.csv"] = traces.window_rows(args.availability, args.clients, args.repeat == "client")
    for path, n in traces.write_tables(args.out, tables).items():
        print(
            f"{path}: {n} clients (systems.device_trace)"
            if path.name == "devices.csv"
            else f"{path}: {n} intervals (systems.availability: trace, availability_trace)"
        )
    return EXIT_OK


def _report(e: BaseException, verbose: bool) -> int:
    code, line = explain(e, verbose)
    print(f"raysim: {line}", file=sys.stderr)
    return code


def entry() -> None:
    """The console command: ``main``, then a quick exit. Ray's own exit hook pauses half a
    second before stopping a local Ray, which stops its processes one by one, and unloading
    torch, Ray and MLflow takes seconds more; every result is written by then (MLflow calls are
    synchronous), so raysim stops Ray itself (``stop_for_exit``) and leaves without the
    interpreter's teardown."""
    rc = main(early_ray=True)
    sys.stdout.flush()
    sys.stderr.flush()
    if "raysim.engine.ray_start" in sys.modules:
        from raysim.engine import ray_start

        ray_start.stop_for_exit()
    if "raysim.results.tracker_process" in sys.modules:  # a helper no run took (a refused scenario)
        from raysim.results import tracker_process

        tracker_process.discard()
    os._exit(rc)


if __name__ == "__main__":
    entry()
