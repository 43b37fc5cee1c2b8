"""Workload 7, part 2: time pprobe's query path over a run made by query_gen.py.

Reports the load (reading every shard into Arrow tables and registering them in DuckDB, what
``pprobe query`` does first), then a GROUP BY over ops and a join of ops with tensors, each
timed on its own and end to end through :func:`pprobe.query.run_sql`.
"""

from __future__ import annotations

from _child import ARGS, Span, emit

from pprobe import query

GROUP_BY = "SELECT op, count(*) AS n, sum(dur_ns) AS total_ns FROM ops GROUP BY op ORDER BY n DESC"
JOIN = (
    "SELECT o.op, t.dtype, count(*) AS n, avg(o.dur_ns) AS mean_ns "
    "FROM ops o JOIN tensors t ON o.pid = t.pid AND o.seq = t.seq "
    "WHERE t.role = 'input' GROUP BY ALL ORDER BY n DESC"
)


def main() -> None:
    run = ARGS["run"]
    out: dict = {}
    with Span() as sp:
        con = query.connect(run)
    sp.put(out, "load_s")
    out["ops_rows"] = con.execute("SELECT count(*) FROM ops").fetchone()[0]
    out["tensor_rows"] = con.execute("SELECT count(*) FROM tensors").fetchone()[0]
    for name, sql in (("group_by", GROUP_BY), ("join", JOIN)):
        with Span() as sp:
            con.execute(sql).fetchall()
        sp.put(out, f"{name}_s")
    con.close()
    for name, sql in (("group_by", GROUP_BY), ("join", JOIN)):
        with Span() as sp:
            query.run_sql(sql, run)
        sp.put(out, f"{name}_end_to_end_s")
    emit(out)


main()
