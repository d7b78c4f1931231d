"""History.plot: a readable PNG of every quantity per epoch, or a clear error without matplotlib."""

from __future__ import annotations

import subprocess
import sys

import pytest

from easyfit.callbacks import History
from tests.helpers import ROOT


def _history(epochs: int, keys: tuple[str, ...]) -> History:
    h = History()
    h.on_train_begin()
    for e in range(epochs):
        h.on_epoch_end(e, {k: 1.0 / (e + 1 + i) for i, k in enumerate(keys)})
    return h


def test_plot_draws_each_quantity_with_training_and_validation(tmp_path):
    from matplotlib.image import imread

    keys = ("loss", "accuracy", "top_k_accuracy", "val_loss", "val_accuracy", "val_top_k_accuracy")
    path = tmp_path / "curves.png"
    figure = _history(4, keys).plot(path)
    assert [ax.get_title() for ax in figure.axes] == ["loss", "accuracy", "top_k_accuracy"]
    for ax in figure.axes:
        assert ax.get_xlabel() == "epoch" and ax.get_ylabel()
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["training", "validation"]
        assert [list(line.get_xdata()) for line in ax.get_lines()] == [[1, 2, 3, 4]] * 2
    height, width = imread(path).shape[:2]
    assert width >= 1000 and height >= 400  # three panels side by side


def test_plot_without_validation_or_without_epochs(tmp_path):
    figure = _history(2, ("loss",)).plot()
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["training"]
    with pytest.raises(ValueError, match="nothing to plot"):
        History().plot(tmp_path / "empty.png")


@pytest.mark.slow
def test_missing_matplotlib_says_how_to_install_it():
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from easyfit.callbacks import History\n"
        "h = History(); h.on_epoch_end(0, {'loss': 1.0})\n"
        "try:\n    h.plot()\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    ).stdout
    assert 'pip install "easyfit-flax[plot]"' in out


def test_plot_leaves_out_input_wait_and_a_constant_learning_rate_unless_asked():
    h = _history(3, ("loss", "accuracy", "input_wait", "val_loss"))
    h.history["learning_rate"] = [1e-3] * 3
    assert [ax.get_title() for ax in h.plot().axes] == ["loss", "accuracy"]
    asked = h.plot(metrics=["loss", "input_wait", "learning_rate"])
    assert [ax.get_title() for ax in asked.axes] == ["loss", "input_wait", "learning_rate"]
    h.history["learning_rate"] = [1e-3, 5e-4, 2.5e-4]  # a schedule: drawn
    assert [ax.get_title() for ax in h.plot().axes] == ["loss", "accuracy", "learning_rate"]
    with pytest.raises(ValueError, match=r"\['top_k'\] not in the history"):
        h.plot(metrics=["top_k"])


def test_the_figure_is_its_own_png_for_notebooks():
    png = _history(2, ("loss",)).plot()._repr_png_()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
