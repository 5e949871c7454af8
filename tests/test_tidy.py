"""report.tidy, the export to pool: which engine measured each row (issue 57, case 170: a server run's export
named neither the engine nor the llama-server)."""
from __future__ import annotations

import polars as pl
import pytest

from harness.report.tidy import TIDY_SCHEMA, tidy

ROW = {"target": "t", "draft": "d", "category": "code", "speedup": 1.2}
CASES = {  # case: (the plan's engine, each row's llama_server_version, the export's engine and llama_server)
    "170-server-run": ("server", ["version: 4242 (fake0000)"], "server", ["4242 (fake0000)"]),
    "170-resumed-on-another-server": ("server", ["version: 1 (a)", "version: 2 (b)"], "server", ["1 (a)", "2 (b)"]),
    "the-harness-loop": ("harness", [None], "harness", [""]),
    "a-plan-from-before-engines": (None, None, "harness", [""]),
}


@pytest.mark.parametrize("engine, versions, want, servers", list(CASES.values()), ids=list(CASES))
def test_the_export_names_the_engine_of_each_row(engine, versions, want, servers):
    rows = [ROW | ({} if versions is None else {"llama_server_version": v}) for v in versions or [None]]
    params = {} if engine is None else {"engine": engine}
    out = tidy(pl.DataFrame(rows), {"params": params, "system": {}, "models": {}}, "run")
    assert out["schema_version"].to_list() == [TIDY_SCHEMA] * len(rows) and TIDY_SCHEMA == 3
    assert out["engine"].to_list() == [want] * len(rows) and out["llama_server"].to_list() == servers
    assert out.columns.index("engine") < out.columns.index("target")
