"""A notebook as a Jupyter user runs it (nbclient, a real ipykernel): fit's progress comes
without warnings, and a cell ending in ``history.plot()`` shows one picture."""

from __future__ import annotations

import os
import re

import pytest

from tests.helpers import ROOT

CELLS = [
    "import sys\n"
    "if HIDE_WIDGETS:\n"
    "    sys.modules['ipywidgets'] = None  # as in a Jupyter without ipywidgets\n"
    "import easyfit as ef\n"
    "from tests.helpers.models import SmallMLP\n"
    "root = ef.datasets.sample_folder(DATA, limit=(200, 100))\n"
    "trainer = ef.Trainer(SmallMLP(), optimizer='adam', seed=0)\n"
    "history = trainer.fit(root, epochs=2, batch_size=50)",
    "history.plot()",
    "import importlib.util; print(importlib.util.find_spec('ipywidgets') is not None)",
    "%matplotlib inline\nimport matplotlib.pyplot\nhistory.plot()",  # with the magic: once too
]


@pytest.mark.slow
@pytest.mark.parametrize("widgets", [False, True], ids=["text bar", "widget"])
def test_a_notebook_shows_progress_without_warnings_and_the_plot_once(widgets, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    if widgets:
        pytest.importorskip("ipywidgets")

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    cells = [c.replace("DATA", repr(str(tmp_path / "data"))) for c in CELLS]
    cells[0] = cells[0].replace("HIDE_WIDGETS", str(not widgets))
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    where = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources=where).execute()
    fit, plot, found, magic = (cell.outputs for cell in notebook.cells)
    text = "".join(o.get("text", "") for o in fit if o.output_type == "stream")
    assert "Warning" not in text, text
    for epoch in (1, 2):  # every metric, under the bar, on a line that names its epoch
        line = rf"^Epoch {epoch}/2 - [\d.]+s - loss: [\d.]+ - .* - val_accuracy: "
        assert re.search(line, text, re.M), text
    assert found[0]["text"].strip() == str(widgets)
    shown = [o for o in fit if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert len(shown) == (2 if widgets else 0)  # a widget per epoch, or tqdm's text bar
    if not widgets:
        assert "Epoch 2/2: 100%|" in text
    for epoch, widget in enumerate(shown, 1):  # as read where widgets are not rendered: the bar's end
        assert widget["data"]["text/plain"].startswith(f"Epoch {epoch}/2: 100%|"), widget["data"]
    for outputs in (plot, magic):
        pictures = [o for o in outputs if "image/png" in o.get("data", {})]
        assert len(pictures) == 1 and len(outputs) == 1, outputs
