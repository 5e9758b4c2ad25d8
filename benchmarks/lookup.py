"""What finding format("kafkalog") by name costs, when, and who pays it (issue 25 item 10).

Run: python benchmarks/lookup.py [--rounds R]

Each round runs two fresh processes, interleaved: `name` (format("kafkalog") found by Spark's lookup of
pyspark_* modules) and `register` (kafkalog_ds.register(spark) first). In each, after the session is up and
one Spark job has warmed the JVM, four actions are timed in order: a batch write of 1000 rows (sink 1), a
batch read of them (source 1), then both again (sink 2, source 2). "others" is the CPU seconds other
processes took meanwhile (2 cores give 2 per second).

Every Python process Spark starts loads a sitecustomize.py put on PYTHONPATH here: it logs the process's
command line (which planner or worker it is) when it starts, and the seconds `pyspark_kafkalog` takes to
import in it. So the table below says how many Python processes each action started, of which kind, and
how much of their time went to importing our packages (pyspark_kafkalog, python_datasource, storage,
kafkalog_ds; the outermost import in each process).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sink import machine_busy_seconds, tree_cpu_seconds  # noqa: E402

SITECUSTOMIZE = r'''
import json, os, sys, time
_log = os.environ.get("KAFKALOG_LOOKUP_LOG")
if _log:
    def _emit(**event):
        event.update(pid=os.getpid(), t=time.time())
        with open(_log, "a") as f:
            f.write(json.dumps(event) + "\n")
    _emit(event="start", argv=" ".join(sys.argv)[-160:], ppid=os.getppid())

    import importlib.abc, importlib.machinery

    OURS = ("pyspark_kafkalog", "python_datasource", "storage", "kafkalog_ds")
    _depth = [0]

    class _Timed(importlib.abc.MetaPathFinder):
        """Times each outermost import of a module of our packages in this process (a package's __init__
        runs before its submodules are imported, so every module is timed and only the outermost kept)."""

        def find_spec(self, name, path, target=None):
            if name.split(".")[0] not in OURS:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            real = spec.loader.exec_module

            def exec_module(module):
                t0 = time.perf_counter()
                _depth[0] += 1
                try:
                    real(module)
                finally:
                    _depth[0] -= 1
                    if _depth[0] == 0:
                        _emit(event="import", module=name, seconds=time.perf_counter() - t0, depth=0)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, _Timed())
'''

ACTIONS = ["sink 1", "source 1", "sink 2", "source 2"]


def child(mode: str, root: str) -> None:
    """One fresh session: print one JSON line per action with its wall time, start and end."""
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName(f"kafkalog-lookup-{mode}")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(10).count()  # JVM, Python daemon and a worker up
    if mode == "register":
        import kafkalog_ds

        t = time.time()
        kafkalog_ds.register(spark)
        print("RESULT " + json.dumps({"action": "register()", "start": t, "end": time.time()}), flush=True)
    df = spark.range(1000).selectExpr("CAST(id AS STRING) AS key", "CAST(id AS STRING) AS value")
    me = os.getpid()
    for action in ACTIONS:
        cpu0, busy0, t0 = tree_cpu_seconds(me), machine_busy_seconds(), time.time()
        if action.startswith("sink"):
            df.write.format("kafkalog").mode("append").option("topic", "t").option("partitions", 2).save(root)
        else:
            n = spark.read.format("kafkalog").option("subscribe", "t").load(root).count()
            assert n >= 1000, n
        t1 = time.time()
        others = max(0.0, machine_busy_seconds() - busy0 - (tree_cpu_seconds(me) - cpu0))
        print("RESULT " + json.dumps({"action": action, "start": t0, "end": t1, "others": others}), flush=True)
    spark.stop()


def run_child(mode: str, work: str, site: str) -> tuple[list[dict], list[dict]]:
    root = tempfile.mkdtemp(dir=work)
    log = os.path.join(work, f"events-{mode}-{os.path.basename(root)}.jsonl")
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "PYTHONPATH": site + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "KAFKALOG_LOOKUP_LOG": log,
    }
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", mode, "--root", root],
        env=env,
        capture_output=True,
        text=True,
    )
    results = [json.loads(ln[7:]) for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or len([r for r in results if r["action"] in ACTIONS]) != len(ACTIONS):
        raise RuntimeError(f"{mode} run failed:\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    with open(log) as f:
        events = [json.loads(ln) for ln in f]
    return results, events


def kind(argv: str) -> str:
    for word in argv.split():
        if word.startswith("pyspark.sql.worker.") or word in ("pyspark.daemon", "pyspark.worker"):
            return word.replace("pyspark.sql.worker.", "")
    return "driver" if "lookup.py" in argv else argv.split("/")[-1][:40]


def attribute(results: list[dict], events: list[dict]) -> dict:
    """Per action: Python processes started (by kind) and seconds of pyspark_kafkalog imports."""
    spans = [(r["action"], r["start"], r["end"]) for r in results]
    out: dict = {a: {"starts": Counter(), "import_s": 0.0, "imports": 0} for a, _, _ in spans}
    out["before"] = {"starts": Counter(), "import_s": 0.0, "imports": 0}
    argv_of = {e["pid"]: e["argv"] for e in events if e["event"] == "start"}
    for e in events:
        where = next((a for a, s, t in spans if s <= e["t"] <= t), "before")
        if e["event"] == "start":
            out[where]["starts"][kind(e["argv"])] += 1
        else:
            out[where]["import_s"] += e["seconds"]
            out[where]["imports"] += 1
            who = kind(argv_of[e["pid"]]) if e["pid"] in argv_of else "forked worker"  # forked by pyspark.daemon
            out[where].setdefault("importers", {})[e["pid"]] = who
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child")
    ap.add_argument("--root")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.root)
        return
    work = tempfile.mkdtemp(prefix="kafkalog-lookup-")
    site = os.path.join(work, "site")
    os.makedirs(site)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    walls: dict = defaultdict(list)
    others: dict = defaultdict(float)
    detail: dict = {}
    try:
        for r in range(args.rounds):
            for mode in ("name", "register") if r % 2 == 0 else ("register", "name"):
                results, events = run_child(mode, work, site)
                for res in results:
                    walls[mode, res["action"]].append(res["end"] - res["start"])
                    others[mode] += res.get("others", 0.0)
                detail[mode] = attribute(results, events)
        print(f"{args.rounds} rounds, interleaved; wall seconds, best (range); others: CPU s of other processes")
        print(f"{'action':<10} {'by name':>18} {'register()':>18} {'name/register':>14}")
        for action in ["register()"] + ACTIONS:
            a, b = walls.get(("name", action)), walls.get(("register", action))
            fa = f"{min(a):.2f} ({min(a):.1f}-{max(a):.1f})" if a else "-"
            fb = f"{min(b):.2f} ({min(b):.1f}-{max(b):.1f})" if b else "-"
            ratio = f"{min(a) / min(b):.2f}x" if a and b else ""
            print(f"{action:<10} {fa:>18} {fb:>18} {ratio:>14}")
        print(f"others: by name {others['name']:.1f} s, register {others['register']:.1f} s (all rounds)")
        print("\nPython processes Spark started per action (last round), and pyspark_kafkalog imports in them:")
        for mode in ("name", "register"):
            for action, d in detail[mode].items():
                starts = ", ".join(f"{k} {n}" for k, n in sorted(d["starts"].items()))
                by_kind = Counter(d.get("importers", {}).values())
                importers = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
                print(
                    f"  {mode:<8} {action:<10} started: {starts or '-'}; our modules imported in "
                    f"{sum(by_kind.values())} processes ({importers or '-'}), {d['import_s']:.2f} s"
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
