"""Issue 19, items 1 and 6: a damaged, truncated, foreign or plain-text store is refused when opened (one clear
StoreCorrupt naming the file), never written to, ends a command in one line with exit 2 before any model work,
and leaves the dashboard usable."""
from __future__ import annotations

import os
import random
import sqlite3
import time

import pytest

from dsocr_core.cli import main
from dsocr_core.results.store import RunStore, StoreCorrupt, StoreError

ENV = {"device": "cuda:0", "gpu_name": "NVIDIA H200"}
WEIGHTS = {"source": "synthetic", "synthetic": True, "detail": "test"}
PAGE = 4096


def _filled(path, points=60):
    store = RunStore(path)
    run_id = store.create_run("sweep", "healthy run", ENV, WEIGHTS, dtype="bfloat16", attn="sdpa")
    for i in range(points):  # ~2 KB per point: the file spans many b-tree pages
        store.put_point(run_id, {"mode": "gundam", "text_tokens": i + 1}, stages={
            "prefill": {"median_s": 0.1, "repeats": 3, "note": "x" * 2000}})
    return store, run_id


def _damage(path, how: str) -> bytes:
    data = path.read_bytes()
    rng = random.Random(19)
    if how == "middle":  # random bytes over a whole page in the middle of the file
        at = (len(data) // PAGE // 2) * PAGE
        data = data[:at] + bytes(rng.randrange(256) for _ in range(PAGE)) + data[at + PAGE:]
    elif how == "truncated":
        data = data[:len(data) // 3]
    elif how == "header":
        data = b"\x00" * 100 + data[100:]
    elif how == "text":
        data = b"these are my notes, not a database\n" * 50
    elif how == "cells":  # a b-tree page's header bytes flipped: the file opens, SQLite's check reports several lines
        data = _damaged_cells(path, data)
    path.write_bytes(data)
    return data


def _damaged_cells(path, data: bytes) -> bytes:
    """`data` with a few bytes flipped at the start of one page, chosen so that SQLite opens the file and its
    quick_check reports the damage on more than one line ("*** in database main ***\nOn tree page ...")."""
    for seed in range(50):
        rng = random.Random(seed)
        damaged = bytearray(data)
        page = rng.randrange(1, len(data) // PAGE)
        for _ in range(4):
            damaged[page * PAGE + rng.randrange(0, 40)] ^= 0xFF
        path.write_bytes(bytes(damaged))
        try:
            conn = sqlite3.connect(path)
            report = [r[0] for r in conn.execute("PRAGMA quick_check(5)")]
            conn.close()
        except sqlite3.DatabaseError:
            continue
        if any("\n" in row for row in report):
            return bytes(damaged)
    raise AssertionError("no damage found that SQLite's check reports on several lines")


@pytest.fixture
def store_file(tmp_path):
    path = tmp_path / "runs.sqlite"
    _filled(path)
    for extra in ("-wal", "-shm"):  # all connections are closed: the file alone holds the store
        assert not (tmp_path / f"runs.sqlite{extra}").exists()
    return path


@pytest.mark.parametrize("how", ["middle", "truncated", "header", "text"])
def test_a_damaged_store_is_refused_and_left_untouched(store_file, how):
    data = _damage(store_file, how)
    with pytest.raises(StoreCorrupt) as err:
        RunStore(store_file)
    msg = str(err.value)
    assert str(store_file) in msg and "unusable" in msg and "\n" not in msg
    assert isinstance(err.value, StoreError) and isinstance(err.value, ValueError)
    assert store_file.read_bytes() == data  # not one byte written (no journal switch, no run, no schema)


def test_an_sqlite_file_of_another_application_is_not_taken_over(tmp_path):
    path = tmp_path / "other.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(StoreCorrupt, match="customers.*not a run store"):
        RunStore(path)
    assert path.read_bytes() == before


def test_a_folder_is_not_a_store(tmp_path):
    with pytest.raises(StoreCorrupt, match="folder"):
        RunStore(tmp_path)


def test_corruption_met_later_refuses_every_write(store_file):
    store = RunStore(store_file)
    size = store_file.stat().st_size
    data = store_file.read_bytes()
    rng = random.Random(6)
    store_file.write_bytes(data[:PAGE] + bytes(rng.randrange(256) for _ in range(size - PAGE)))  # keep the header
    with pytest.raises(StoreCorrupt):
        store.list_runs()
    damaged = store_file.read_bytes()
    with pytest.raises(StoreCorrupt, match="unusable"):
        store.create_run("sweep", "after the damage", ENV, WEIGHTS)
    with pytest.raises(StoreCorrupt):
        store.put_point("00" * 16, {"mode": "tiny"})
    assert store_file.read_bytes() == damaged


def test_the_check_is_quick(tmp_path):
    """The open-time check reads the whole file; on this 2-core machine a store of 1,000 points (2 KB of extras
    each) opens in well under a second."""
    path = tmp_path / "big.sqlite"
    store = RunStore(path)
    run_id = store.create_run("sweep", "big", ENV, WEIGHTS)
    with store._write() as conn:  # bulk insert for speed; the same rows put_point writes
        for i in range(1000):
            conn.execute("INSERT INTO points (run_id, key, status, message, extra, updated_at) VALUES "
                         "(?, ?, 'done', '', ?, '2026-01-01T00:00:00+00:00')",
                         (run_id, f'{{"text_tokens":{i}}}', '{"note":"' + "x" * 2000 + '"}'))
    t0 = time.perf_counter()
    RunStore(path).check()
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed


# ------------------------------------------------------------------------------------------------ command line
def _no_model(*_a, **_k):
    raise AssertionError("the model was loaded although the store is unusable")


def test_measure_refuses_a_corrupt_store_before_loading_the_model(store_file, monkeypatch, capsys):
    import dsocr_core.commands.measure as measure_cmd

    data = _damage(store_file, "middle")
    monkeypatch.setattr(measure_cmd, "session_from_args", _no_model)
    code = main(["measure", "--synthetic", "tiny", "--device", "cpu", "--modes", "tiny", "--store", str(store_file)])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and str(store_file) in err and "malformed" in err
    assert "left untouched; move it aside" in err  # before: SQLite's report had a newline, the advice was cut
    assert store_file.read_bytes() == data


@pytest.mark.parametrize("how", ["truncated", "header", "text", "middle", "cells"])
def test_runs_and_profile_say_one_line_on_an_unreadable_store(store_file, how, monkeypatch, capsys):
    import dsocr_core.commands.profile as profile_cmd
    from dsocr_core.grounding.samples import sample_pages

    _damage(store_file, how)
    assert main(["runs", "--store", str(store_file)]) == 2
    _, err = capsys.readouterr()
    assert len(err.strip().splitlines()) == 1 and str(store_file) in err
    assert "left untouched; move it aside" in err and "re-import exported runs" in err, err
    monkeypatch.setattr(profile_cmd, "session_from_args", _no_model)
    code = main(["profile", "--pages", str(sample_pages()[-1]), "--synthetic", "tiny", "--device", "cpu",
                 "--store", str(store_file)])
    _, err = capsys.readouterr()
    assert code == 2 and len(err.strip().splitlines()) == 1 and str(store_file) in err
    assert "left untouched; move it aside" in err, err


# ------------------------------------------------------------------------------------------------ dashboard
def test_dashboard_names_the_unusable_store_and_stays_usable(store_file, tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    data = _damage(store_file, "text")
    (tmp_path / "reference").mkdir()
    monkeypatch.setenv("DSOCR_STORE", str(store_file))
    monkeypatch.setenv("DSOCR_REFERENCE_DIR", str(tmp_path / "reference"))
    at = AppTest.from_file(os.path.join(os.path.dirname(__file__), "..", "app.py"), default_timeout=120).run()
    assert not at.exception, at.exception
    for page in ("measured", "mfu", "analytic"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])
        errors = [e.value for e in at.error]
        assert len(errors) == 1 and "runs\\.sqlite" in errors[0] and "not kept" in errors[0], (page, errors)
    assert store_file.read_bytes() == data
