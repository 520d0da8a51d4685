"""tuning/config.py: checks of a search's configuration made before anything runs."""

import pytest


def test_storage_checked_before_any_data_loads(tmp_path):
    """The storage's local file must be creatable: the message names the folder or file."""
    from dpfair.errors import TuningError
    from dpfair.tuning.config import check_storage, storage_file

    check_storage(f"sqlite:///{tmp_path / 'ok.db'}")
    check_storage(f"journal:{tmp_path / 'ok.log'}")
    check_storage("postgresql://user@host/db")  # a server: nothing local to check
    assert storage_file("sqlite:///rel.db") == (tmp_path.cwd() / "rel.db")
    missing = tmp_path / "nope" / "x.db"
    with pytest.raises(TuningError, match=f"the folder {tmp_path / 'nope'} does not exist"):
        check_storage(f"sqlite:///{missing}")
    with pytest.raises(TuningError, match="is a folder; give a file path"):
        check_storage(f"journal:{tmp_path}")
    with pytest.raises(TuningError, match="'bogus' is not a storage URL"):
        check_storage("bogus")
