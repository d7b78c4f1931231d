"""``DataInputs.fit_data``: fit's data resolved once, with the facts fit reads of it (the input
scale, the class names, whether the labels are known up front, the notes a verbose fit says)
worked out there, so that the trainer reads facts and does not ask its sources again."""

from __future__ import annotations

import numpy as np

import easyfit as ef
from easyfit.persistence.fingerprint import data_fingerprint  # the old path, kept


def test_fit_data_holds_the_facts_fit_reads_of_its_sources():
    inputs = ef.data.DataInputs(ef.parallel.Placement.create(), seed=0)
    x, y = np.full((10, 4, 4, 1), 255, np.uint8), np.arange(10) % 2
    try:
        data = inputs.fit_data(x, y, validation_split=0.2, shuffle=True, verbose=True)
        assert (len(data.train), len(data.validation)) == (8, 2)
        assert data.scale is None and data.class_names is None and data.labels_known
        assert data.windows is None and data.left_out == ()  # arrays: no blocks, no listing
        assert data.unscaled is not None and data.unscaled.startswith("x is uint8 with values up to 255")
        quiet = inputs.fit_data(ef.data.Arrays(x, y, scale=1 / 255, class_names=["a", "b"]), verbose=False)
        assert quiet.validation is None and quiet.unscaled is None
        assert quiet.scale == 1 / 255 and quiet.class_names == ["a", "b"]
        # the fingerprint (what a backup records, the processes compare): the data's, kept
        assert data.fingerprint == data_fingerprint(data.train) and data.fingerprint is data.fingerprint
        assert data.validation_fingerprint == data_fingerprint(data.validation)
        assert data.fingerprint["subset"] != data.validation_fingerprint["subset"]
        assert quiet.validation_fingerprint is None
    finally:
        inputs.close()
