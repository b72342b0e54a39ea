"""Salted password hashes."""

from chalicelib.control.passwords import dummy_hash, hash_password, verify_password


def test_hash_is_salted_and_verifies_only_the_password():
    first, second = hash_password("s3cret"), hash_password("s3cret")
    assert first != second and "s3cret" not in first
    assert first.startswith("scrypt$")
    assert verify_password("s3cret", first) and verify_password("s3cret", second)
    assert not verify_password("s3cret!", first)


def test_malformed_hashes_never_verify():
    for encoded in ("", "plain", "bcrypt$1$2$3$4$5", "scrypt$x$8$1$AA==$AA==", "scrypt$14$8$1$!!$??"):
        assert not verify_password("anything", encoded)


def test_dummy_hash_is_a_real_hash_nobody_knows():
    assert dummy_hash() == dummy_hash()
    assert not verify_password("", dummy_hash())
