"""README samples and docs/isa.md come from the code: a block that no longer matches what the
commands print fails here (regenerate with `python -m tools.readme` / `python -m tools.isadoc`)."""
import pytest

from tools import isadoc, readme

QUICK = [k for k, s in readme.SAMPLES.items() if not s.slow]
SLOW = [k for k, s in readme.SAMPLES.items() if s.slow]


def test_every_sample_has_a_block_in_the_readme():
    with open(readme.README) as f:
        have = readme.blocks(f.read())
    assert set(readme.SAMPLES) <= set(have), sorted(set(readme.SAMPLES) - set(have))


@pytest.mark.parametrize("key", QUICK)
def test_quick_sample_is_current(key):
    assert readme.stale([key]) == [], f"README sample '{key}' is stale: python -m tools.readme --only {key}"


@pytest.mark.slow
@pytest.mark.parametrize("key", SLOW)
def test_slow_sample_is_current(key):
    assert readme.stale([key]) == [], f"README sample '{key}' is stale: python -m tools.readme --only {key}"


def test_normalize_masks_wall_times_only():
    assert readme.normalize("x in 1.46 s, 937 cycles") == readme.normalize("x in 20 s, 937 cycles")
    assert readme.normalize("937 cycles") != readme.normalize("938 cycles")


def test_readme_cycle_counts_are_the_golden_ones():
    """Every program row of the README's tables (generated or kept by hand) has the cycle count
    of tests/golden_cycles.json at default params on tsp-v1."""
    import json
    import os
    with open(os.path.join(readme.ROOT, "tests", "golden_cycles.json")) as f:
        golden = {e["program"]: e["cycles"] for e in json.load(f)["programs"]
                  if e["machine"] == "tsp-v1" and not e["params"]}
    with open(readme.README) as f:
        rows = readme.table_cycles(f.read())
    assert set(readme.TABLE_PROGRAMS) <= set(rows) and {"bert_base", "gpt2_small_prefill"} <= set(rows)
    for name, cycles in rows.items():
        assert cycles == golden[name], f"README: {name} has {cycles:,} cycles, tests/golden_cycles.json {golden[name]:,}"


def test_isa_doc_is_current():
    with open(isadoc.PATH) as f:
        assert f.read() == isadoc.render(), "docs/isa.md is stale: python -m tools.isadoc"


def test_commands_table_lists_every_command():
    from lpu.cli import build_parser
    ap = build_parser()
    sub = next(a for a in ap._actions if a.__class__.__name__ == "_SubParsersAction")
    table = readme.commands_table()
    for name in sub.choices:
        assert f"`lpu {name} " in table or f"`lpu {name}`" in table
