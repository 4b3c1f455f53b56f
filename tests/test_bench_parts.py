"""A benchmark run in parts (bench/pfl_parts.py) and its runs moved between MLflow stores
(bench/runs_io.py): the table ``raysim compare`` makes from the imported runs is the table of the
original runs, and a part skips what earlier parts finished."""

import json
import sys
from pathlib import Path

from conftest import write_scenario
from test_compare import SWEEP

from raysim import cli
from raysim.results import report
from raysim.results.compare import compare

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import pfl_parts  # noqa: E402
import runs_io  # noqa: E402

EXPERIMENT = "raysim"  # test_compare's SWEEP: 2 variants x 2 seeds, tracked in {tmp}/m.db


def test_imported_runs_give_the_same_table_and_a_second_import_adds_nothing(tmp_path):
    path = write_scenario(tmp_path, SWEEP.format(tmp=tmp_path))
    assert cli.main(["run", path, "--engine", "serial", "-q"]) == 0
    a, b = f"sqlite:///{tmp_path}/m.db", f"sqlite:///{tmp_path}/b.db"
    for history in (False, True):
        out = tmp_path / f"runs-{history}.jsonl"
        assert runs_io.export(a, EXPERIMENT, str(out), history=history) == 4  # 2 variants x 2 seeds, no parent
        recs = [json.loads(line) for line in open(out)]
        assert sorted((r["tags"]["variant"], r["tags"]["seed"]) for r in recs) == [
            ("fedavg", "0"),
            ("fedavg", "1"),
            ("local", "0"),
            ("local", "1"),
        ]
        rounds = {len(r["metrics"]["accuracy"]) for r in recs}
        assert rounds == ({2} if history else {1})  # eval every round, 2 rounds
    assert runs_io.load(str(tmp_path / "runs-True.jsonl"), b, EXPERIMENT) == (4, 0)
    assert runs_io.load(str(tmp_path / "runs-False.jsonl"), b, EXPERIMENT) == (0, 4)  # same source ids
    _, client = report.client_for(a)
    _, cb = report.client_for(b)
    src = {r.info.run_id: r for r in client.search_runs([client.get_experiment_by_name(EXPERIMENT).experiment_id])}
    for r in cb.search_runs([cb.get_experiment_by_name(EXPERIMENT).experiment_id]):
        o = src[r.data.tags[runs_io.SOURCE_TAG]]
        assert r.data.metrics == o.data.metrics and r.data.params == o.data.params
        assert (r.info.start_time, r.info.end_time, r.info.status) == (o.info.start_time, o.info.end_time, "FINISHED")
        hist = [m.value for m in cb.get_metric_history(r.info.run_id, "accuracy")]
        assert hist == [m.value for m in client.get_metric_history(o.info.run_id, "accuracy")]
    md_a, _, csv_a = compare([], EXPERIMENT, a, tmp_path / "ta", over="clients")
    md_b, _, csv_b = compare([], EXPERIMENT, b, tmp_path / "tb", over="clients")
    assert md_a == md_b and "fedavg" in md_a and "(n=2" in md_a
    assert csv_a.read_text().count("\n") == csv_b.read_text().count("\n")


FAKE = """#!{python}
import sys
args = sys.argv[1:]
variant, seed = args[args.index("--variant") + 1], args[args.index("--seeds") + 1]
open({log!r}, "a").write(variant + " " + seed + "\\n")
if variant == "broken":
    sys.exit(1)                      # stopped from outside: not done, runs again next part
if variant == "wild":
    print("raysim: run failed: Diverged: training diverged in round 3"); sys.exit(1)
"""


def test_a_part_skips_pairs_done_or_exported_reruns_stopped_ones_and_keeps_its_deadline(tmp_path):
    log = tmp_path / "calls.txt"
    fake = tmp_path / "raysim"
    fake.write_text(FAKE.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    jobs = tmp_path / "jobs.tsv"
    jobs.write_text("a\t0\t10\na\t1\t10\nb\t0\t10\nbroken\t0\t10\nwild\t0\t10\nslow\t0\t1000\n")
    exported = tmp_path / "part1.jsonl"
    exported.write_text(json.dumps({"status": "FINISHED", "tags": {"variant": "a", "seed": "1"}, "params": {}}) + "\n")
    d = tmp_path / "part"
    d.mkdir()
    (d / "done-earlier.txt").write_text("b\t0\n")
    args = [
        "--jobs",
        str(jobs),
        "--dir",
        str(d),
        "--workers",
        "2",
        "--raysim",
        str(fake),
        "--skip",
        str(exported),
        "--deadline",
        "500",
    ]
    assert pfl_parts.main(args) == 0
    assert sorted(log.read_text().split("\n")[:-1]) == ["a 0", "broken 0", "wild 0"]  # slow: past the deadline
    assert sorted(open(d / "done.txt").read().split("\n")[:-1]) == ["a\t0", "wild\t0"]
    log.unlink()
    assert pfl_parts.main(args) == 0
    assert log.read_text() == "broken 0\n"  # only the stopped pair, again


def test_a_pair_appended_to_the_jobs_file_while_a_part_runs_is_run_by_it(tmp_path):
    """The first pair's run appends a second pair to the jobs file (as one adds the other lrs of
    a method whose chosen lr failed at another seed); the part, one worker, runs it next."""
    log, jobs = tmp_path / "calls.txt", tmp_path / "jobs.tsv"
    fake = tmp_path / "raysim"
    fake.write_text(
        FAKE.format(python=sys.executable, log=str(log))
        + f"if variant == 'a':\n    open({str(jobs)!r}, 'a').write('late\\t2\\t5\\n')\n"
    )
    fake.chmod(0o755)
    jobs.write_text("a\t0\t5\n")
    d = tmp_path / "part"
    assert pfl_parts.main(["--jobs", str(jobs), "--dir", str(d), "--workers", "1", "--raysim", str(fake)]) == 0
    assert log.read_text() == "a 0\nlate 2\n"
    assert open(d / "done.txt").read() == "a\t0\nlate\t2\n"


def test_a_part_appends_each_finished_run_to_the_results_file(tmp_path):
    path = write_scenario(tmp_path, SWEEP.format(tmp=tmp_path))
    jobs = tmp_path / "jobs.tsv"
    jobs.write_text("fedavg\t0\t5\nlocal\t1\t5\n")
    results = tmp_path / "runs.jsonl"
    raysim = str(Path(sys.executable).parent / "raysim")
    assert (
        pfl_parts.main(
            [
                "--jobs",
                str(jobs),
                "--scenario",
                path,
                "--dir",
                str(tmp_path / "part"),
                "--workers",
                "1",
                "--raysim",
                raysim,
                "--experiment",
                EXPERIMENT,
                "--results",
                str(results),
            ]
        )
        == 0
    )
    recs = [json.loads(line) for line in open(results)]
    assert sorted((r["tags"]["variant"], r["tags"]["seed"], r["status"]) for r in recs) == [
        ("fedavg", "0", "FINISHED"),
        ("local", "1", "FINISHED"),
    ]
    assert pfl_parts.finished_pairs([str(results)]) == {("fedavg", "0"), ("local", "1")}
    # the next part, given the file, has nothing left to run
    assert (
        pfl_parts.main(
            [
                "--jobs",
                str(jobs),
                "--scenario",
                path,
                "--dir",
                str(tmp_path / "next"),
                "--raysim",
                "/nonexistent",
                "--skip",
                str(results),
            ]
        )
        == 0
    )
    assert not (tmp_path / "next" / "log.txt").exists()


def test_the_committed_benchmark_runs_are_the_listed_pairs_once_each_as_their_variants_say():
    results = Path(__file__).resolve().parents[1] / "bench" / "results"
    jobs = {tuple(line.split("\t")[:2]) for line in (results / "pfl_benchmark_jobs.tsv").read_text().splitlines()}
    assert len(jobs) == 183
    seen = set()
    for line in open(results / "pfl_benchmark_runs.jsonl"):
        r = json.loads(line)
        variant, seed = r["tags"]["variant"], r["tags"]["seed"]
        assert (variant, seed) in jobs and (variant, seed) not in seen, (variant, seed)
        seen.add((variant, seed))
        method, lr = variant.split(",lr=")
        p = r["params"]
        assert r["status"] == "FINISHED" and p["seed"] == seed and float(p["algorithm.lr"]) == float(lr)
        name, split = method.rsplit("-", 1)
        assert (name, split, p["rounds"]) == (p["algorithm.name"], p["data.partition.kind"], "100")
        assert "accuracy" in r["metrics"] and "val_accuracy" in r["metrics"]
