"""A notebook as a Jupyter user runs it (nbclient, a real ipykernel): fit's progress comes
without warnings, and a cell ending in ``history.plot()`` shows one picture."""

from __future__ import annotations

import os

import pytest

from tests.helpers import ROOT

CELLS = [
    "import easyfit as ef\n"
    "from tests.helpers.models import SmallMLP\n"
    "root = ef.datasets.sample_folder(DATA, limit=(200, 100))\n"
    "trainer = ef.Trainer(SmallMLP(), optimizer='adam', seed=0)\n"
    "history = trainer.fit(root, epochs=2, batch_size=50)",
    "history.plot()",
    "import importlib.util; print(importlib.util.find_spec('ipywidgets') is not None)",
]


@pytest.mark.slow
def test_a_notebook_shows_progress_without_warnings_and_the_plot_once(tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    cells = [c.replace("DATA", repr(str(tmp_path / "data"))) for c in CELLS]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    where = {"metadata": {"path": str(tmp_path)}}
    NotebookClient(notebook, timeout=600, kernel_name="python3", resources=where).execute()
    fit, plot, widgets = (cell.outputs for cell in notebook.cells)
    text = "".join(o.get("text", "") for o in fit if o.output_type == "stream")
    assert "Warning" not in text, text
    assert "Epoch 2/2" in text and "val_accuracy: " in text, text
    if widgets[0]["text"].strip() == "True":  # with ipywidgets: tqdm's widget
        assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in fit)
    pictures = [o for o in plot if "image/png" in o.get("data", {})]
    assert len(pictures) == 1 and len(plot) == 1, plot
