"""One run per output folder: the lock refuses a second holder, and its file is gone once the run ends."""

import os

import pytest

from hydraplan.core.errors import UserError
from hydraplan.store import runlock
from hydraplan.store.runlock import LOCK_NAME, locked_folder


def test_the_lock_file_is_removed_after_a_run_and_after_a_clean_failure(tmp_path):
    out = tmp_path / "run"
    with locked_folder(out, "--out"):
        assert (out / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} ")
        with pytest.raises(UserError, match=f"--out {out}: in use by pid {os.getpid()} "):
            with locked_folder(out, "--out"):
                pass
    assert list(out.iterdir()) == []
    with pytest.raises(UserError, match="planning failed"):
        with locked_folder(out, "--out"):
            raise UserError("planning failed")
    assert list(out.iterdir()) == []


def test_a_process_that_opened_the_file_before_it_was_removed_does_not_get_a_second_lock(tmp_path, monkeypatch):
    """B opens the lock file, its holder A ends (removing it), C locks a new file: B then locks the removed
    file, sees that the path names another one, and is refused by C's lock instead of running beside C."""
    out = tmp_path / "run"
    with locked_folder(out, "--out"):
        stale = os.open(out / LOCK_NAME, os.O_RDWR)  # B
    real_open = os.open
    opened = []

    def open_stale_first(path, *args, **kwargs):
        opened.append(path)
        return stale if len(opened) == 1 else real_open(path, *args, **kwargs)

    with locked_folder(out, "--out"):  # C
        monkeypatch.setattr(runlock.os, "open", open_stale_first)
        with pytest.raises(UserError, match="in use by pid"):
            with locked_folder(out, "--out"):  # B
                pass
        monkeypatch.undo()
    assert len(opened) == 2 and list(out.iterdir()) == []
