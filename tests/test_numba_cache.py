"""emulator/arith.drop_stale_cache: a change to any module of the package drops every cached
function of it (Numba itself only notices changes to a function's own file)."""
import os

from lpu.emulator.arith import drop_stale_cache


def _write(path, text):
    with open(path, "w") as f:
        f.write(text)


def test_a_change_to_any_module_drops_every_cached_function(tmp_path):
    src, cache = tmp_path / "pkg", tmp_path / "cache"
    src.mkdir()
    _write(src / "a.py", "x = 1\n")
    _write(src / "b.py", "y = 2\n")
    cache.mkdir()
    for name in ("a.f-1.py311.nbi", "a.f-1.py311.1.nbc", "b.g-3.py311.nbi", "keep.txt"):
        _write(cache / name, "")
    drop_stale_cache(str(src), [str(cache)])             # no stamp yet: nothing is trusted
    assert sorted(os.listdir(cache)) == ["emulator.stamp", "keep.txt"]
    _write(cache / "a.f-1.py311.nbi", "")
    drop_stale_cache(str(src), [str(cache)])             # sources unchanged: the cache stays
    assert "a.f-1.py311.nbi" in os.listdir(cache)
    _write(src / "b.py", "y = 3\n")                      # another module than a.py's changes
    drop_stale_cache(str(src), [str(cache)])
    assert "a.f-1.py311.nbi" not in os.listdir(cache)


def test_a_cache_folder_not_made_yet_gets_a_stamp(tmp_path):
    src = tmp_path / "pkg"
    src.mkdir()
    _write(src / "a.py", "x = 1\n")
    drop_stale_cache(str(src), [str(tmp_path / "later")])
    assert os.listdir(tmp_path / "later") == ["emulator.stamp"]
