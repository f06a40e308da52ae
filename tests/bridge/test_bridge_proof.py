"""The proof's bytes, pinned against wire.md, and the key file's rules."""

from __future__ import annotations

import hashlib
import hmac
import os

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
