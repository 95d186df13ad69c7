import pytest

from lmlm.kb import key_text, normalize_key, normalize_text, normalize_value


@pytest.mark.parametrize("a, b", [
    (("Ada Lovelace", "Birth City"), ("  ada   lovelace ", "BIRTH CITY")),
    (("Ada Lovelace", "Birth City"), ("Ada_Lovelace", "birth_city:")),
    (("Ada Lovelace", "Birth City"), ("\"Ada Lovelace\"", "Birth City.")),
    (("Ｆｕｌｌ Width", "x"), ("Full Width", "X")),  # NFKC
    (("Straße", "Ort"), ("STRASSE", "ort")),  # casefold
])
def test_normalize_key_equates_spellings(a, b):
    assert normalize_key(*a) == normalize_key(*b)


def test_normalize_key_keeps_parts_apart():
    assert normalize_key("a b", "c") != normalize_key("a", "b c")
    assert normalize_key("Ada Lovelace", "Birth City") == "ada lovelace\tbirth city"


def test_normalize_text_keeps_inner_punctuation():
    assert normalize_text("  -- O'Brien, Jr. -- ") == "o'brien, jr"
    assert normalize_text("...") == ""


def test_normalize_value_keeps_edge_punctuation():
    assert normalize_value("C++") != normalize_value("C")
    assert normalize_value(" London ") == normalize_value("london")


def test_key_text_is_entity_space_relation():
    assert key_text("Ada Lovelace", "Birth City") == "Ada Lovelace Birth City"


def test_normalize_rejects_non_strings():
    with pytest.raises(TypeError, match="expected str"):
        normalize_text(None)
