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
