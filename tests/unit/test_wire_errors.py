"""Wire exceptions (sie.wire.errors)."""

from sie.wire.errors import DecodeError, EncodeError, WireError


def test_decode_error_joins_message_and_path_like_msgspec():
    error = DecodeError("Expected `str | null`, got `int`", "$.items[0].text")
    assert str(error) == "Expected `str | null`, got `int` - at `$.items[0].text`"
    assert (error.message, error.path) == ("Expected `str | null`, got `int`", "$.items[0].text")


def test_decode_error_at_the_root_has_no_path_suffix():
    assert str(DecodeError("Object missing required field `items`")) == "Object missing required field `items`"


def test_hierarchy():
    assert issubclass(DecodeError, WireError)
    assert issubclass(EncodeError, WireError)
    assert issubclass(EncodeError, TypeError)
    assert not issubclass(DecodeError, ValueError)
