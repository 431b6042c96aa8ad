"""search.cache: trial results by key, in memory and (given a directory) on disk across runs."""

from __future__ import annotations

import math

from aisim.search.cache import TrialCache, config_key


def test_a_memory_cache_holds_what_it_was_given():
    c = TrialCache()
    assert "k" not in c and c.get("k") is None and len(c) == 0
    c["k"] = {"a": 1}
    assert "k" in c and c["k"] == {"a": 1} and len(c) == 1 and list(c) == ["k"]


def test_a_disk_cache_is_read_by_a_later_run_and_a_bad_entry_is_a_miss(tmp_path):
    TrialCache(tmp_path / "c").put("k", {"rows": [[1, math.inf, None, "completed"]]})
    later = TrialCache(tmp_path / "c")
    assert len(later) == 0 and "k" in later  # read from disk on first use
    assert later.get("k") == {"rows": [[1, math.inf, None, "completed"]]}  # inf survives
    (tmp_path / "c" / "bad.json").write_text("{not json")
    (tmp_path / "c" / "old.json").write_text('{"format": 0, "result": 1}')
    assert later.get("bad") is None and later.get("old", "miss") == "miss"


def test_an_unwritable_directory_only_costs_the_next_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    c = TrialCache(blocker / "sub")  # a file where the directory should be
    c.put("k", 1)
    assert c.get("k") == 1 and TrialCache(blocker / "sub").get("k") is None


def test_the_config_key_is_a_digest_of_the_canonical_config():
    a = config_key({"x": 1, "y": [1, 2]})
    assert a == config_key({"y": [1, 2], "x": 1}) and len(a) == 64
    assert a != config_key({"x": 2, "y": [1, 2]}) and a != config_key({"x": 1, "y": [1, 2]}, extra="z")
