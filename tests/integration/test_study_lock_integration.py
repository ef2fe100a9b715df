"""One tuner per study on a real server and a real disk: a second tuner of a study on PostgreSQL (a real server, on
loopback only) is refused, naming the holder and no password; on a full disk the lock is refused and no file is
left."""

import os
import socket

import pytest

from conftest import listening, loopback_only, postgres_server
from servetune.study.storage import StudyError, StudyLock
from support.standins import refused_while_tuned


@pytest.mark.integration
def test_a_second_tuner_of_a_postgresql_study_is_refused_naming_the_holder_and_no_password(tiny_model, tmp_path):
    password = "se/cr@t: p%41ss w0rd"
    with postgres_server(password) as (storage, postmaster):
        assert loopback_only(listening({postmaster})), listening({postmaster})
        message = refused_while_tuned(tiny_model, tmp_path, storage)
    port = storage.rsplit(":", 1)[1].split("/")[0]
    assert message.startswith(f"the study in postgresql+psycopg://postgres:***@127.0.0.1:{port}/servetune is being "
                              f"tuned by pid {os.getpid()} on {socket.gethostname()} since ")
    assert "(it holds the study's lock on the database server)" in message
    assert "cr@t" not in message and "cr%40t" not in message


@pytest.mark.integration
def test_on_a_full_disk_the_lock_is_refused_and_no_file_is_left(full_disk):
    with pytest.raises(StudyError, match="cannot write the lock file .*: No space left on device"):
        StudyLock(full_disk, f"sqlite:///{full_disk / 'study.db'}").acquire()
    assert [p.name for p in full_disk.iterdir()] == ["filler"]
