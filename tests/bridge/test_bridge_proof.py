"""The proof's bytes, pinned against wire.md, and the key file's rules."""

from __future__ import annotations

import hashlib
import hmac
import os
import threading

import pytest

from cloudstore.bridge.proof import KeyFileError, compute_proof, proof_matches, proof_message, read_key_file

KEY = bytes(range(32))


def test_message_bytes_are_exactly_as_wire_md_lays_them_out():
    assert proof_message(None, "a1") == b"link store bridge v1\x00" + b"\x00" + b"\x00\x00\x00\x02a1"
    assert proof_message("o1", "a1") == (
        b"link store bridge v1\x00" + b"\x01\x00\x00\x00\x02o1" + b"\x00\x00\x00\x02a1"
    )
    # UTF-8 lengths, not character counts.
    assert proof_message("é", "ü") == b"link store bridge v1\x00\x01\x00\x00\x00\x02\xc3\xa9\x00\x00\x00\x02\xc3\xbc"


def test_proof_is_lowercase_hex_hmac_sha256():
    expected = hmac.new(KEY, proof_message("o1", "a1"), hashlib.sha256).hexdigest()
    assert compute_proof(KEY, "o1", "a1") == expected
    assert len(expected) == 64 and expected == expected.lower()


def test_null_empty_and_split_names_prove_differently():
    proofs = {
        compute_proof(KEY, None, "a"),
        compute_proof(KEY, "", "a"),
        compute_proof(KEY, "a", ""),
        compute_proof(KEY, "ab", "c"),
        compute_proof(KEY, "a", "bc"),
    }
    assert len(proofs) == 5


def test_proof_matches_only_its_own_agent_and_key():
    proof = compute_proof(KEY, "o", "a")
    assert proof_matches(KEY, "o", "a", proof)
    assert not proof_matches(KEY, None, "a", proof)
    assert not proof_matches(bytes(32), "o", "a", proof)
    assert not proof_matches(KEY, "o", "a", proof.upper())


def write_key(path, text: str, mode: int = 0o600) -> str:
    path.write_text(text)
    os.chmod(path, mode)
    return str(path)


def test_key_file_of_one_hex_line_is_read(tmp_path):
    assert read_key_file(write_key(tmp_path / "k", KEY.hex() + "\n")) == KEY
    assert read_key_file(write_key(tmp_path / "k2", KEY.hex())) == KEY


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o620])
def test_key_file_others_may_reach_is_refused(tmp_path, mode):
    with pytest.raises(KeyFileError, match="0600"):
        read_key_file(write_key(tmp_path / "k", KEY.hex() + "\n", mode))


@pytest.mark.parametrize(
    "text",
    [bytes(31).hex() + "\n", "not hex at all\n", KEY.hex() + "\n" + KEY.hex() + "\n", ""],
    ids=["short", "not hex", "two lines", "empty"],
)
def test_malformed_key_file_is_refused(tmp_path, text):
    with pytest.raises(KeyFileError):
        read_key_file(write_key(tmp_path / "k", text))


# -- where the key comes from (issue 12) ---------------------------------------------

NOBODY = 65534


def read_in_thread(path: str) -> object:
    """read_key_file's result or exception, with a hang guard: a FIFO must never make it wait."""
    box: list[object] = []

    def run() -> None:
        try:
            box.append(read_key_file(path))
        except Exception as exc:  # noqa: BLE001 (returned to the test)
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert box, "read_key_file hung"
    return box[0]


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    """Before: open() of a FIFO waited for a writer, hanging the bridge's start."""
    fifo = tmp_path / "k"
    os.mkfifo(fifo, 0o600)
    result = read_in_thread(str(fifo))
    assert isinstance(result, KeyFileError) and "not a regular file" in str(result), result


def test_a_device_is_refused(tmp_path):
    result = read_in_thread("/dev/zero")
    assert isinstance(result, KeyFileError) and "not a regular file" in str(result), result


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file another user's needs root")
def test_a_key_owned_by_another_user_is_refused(tmp_path):
    path = write_key(tmp_path / "k", KEY.hex() + "\n")
    os.chown(path, NOBODY, NOBODY)
    with pytest.raises(KeyFileError, match="owned by uid"):
        read_key_file(path)


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's needs root")
def test_a_key_in_a_folder_owned_by_another_user_is_refused(tmp_path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    path = write_key(folder / "k", KEY.hex() + "\n")
    os.chown(folder, NOBODY, NOBODY)
    with pytest.raises(KeyFileError, match="folder .* is owned by uid"):
        read_key_file(path)


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_key_in_a_folder_others_may_write_is_refused(tmp_path, mode):
    folder = tmp_path / "open"
    folder.mkdir()
    path = write_key(folder / "k", KEY.hex() + "\n")
    os.chmod(folder, mode)
    with pytest.raises(KeyFileError, match="lets others replace the key"):
        read_key_file(path)


def test_a_key_in_a_sticky_folder_like_tmp_is_read(tmp_path):
    """Others may add files to a sticky folder but not replace ours; theirs fail the owner check."""
    folder = tmp_path / "sticky"
    folder.mkdir()
    path = write_key(folder / "k", KEY.hex() + "\n")
    os.chmod(folder, 0o1777)
    assert read_key_file(path) == KEY


def test_a_folder_above_the_key_that_others_may_write_is_refused_too(tmp_path):
    outer = tmp_path / "outer"
    (outer / "inner").mkdir(parents=True)
    path = write_key(outer / "inner" / "k", KEY.hex() + "\n")
    os.chmod(outer, 0o777)  # whoever writes outer may rename inner away and put their own there
    with pytest.raises(KeyFileError, match="outer"):
        read_key_file(path)


def test_a_link_to_a_safe_key_is_followed_but_not_out_of_an_open_folder(tmp_path):
    """Secret mounts give keys as links: followed, and the folders of both ends judged."""
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o700)
    real = write_key(safe / "k", KEY.hex() + "\n")
    os.symlink(real, safe / "link")
    assert read_key_file(str(safe / "link")) == KEY
    open_folder = tmp_path / "open"
    open_folder.mkdir()
    os.symlink(real, open_folder / "link")
    os.chmod(open_folder, 0o777)
    with pytest.raises(KeyFileError, match="lets others replace the key"):
        read_key_file(str(open_folder / "link"))


@pytest.mark.parametrize("key", [bytes(32), b"\xff" * 48], ids=["zeros", "one byte repeated"])
def test_a_key_of_one_repeated_byte_is_refused(tmp_path, key):
    with pytest.raises(KeyFileError, match="one byte repeated"):
        read_key_file(write_key(tmp_path / "k", key.hex() + "\n"))
