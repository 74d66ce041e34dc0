"""colab/quickstart.ipynb runs top to bottom on CPU (tiny model) and shows its results."""

import os

import nbclient
import nbformat

NOTEBOOK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "colab",
                        "quickstart.ipynb")


def test_quickstart_executes_and_shows_the_reward_curve(tmp_path):
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    install_cell = code_cells[0]
    assert "%pip install" in install_cell.source and install_cell.outputs == []
    shown = [output for output in code_cells[-1].outputs
             if output.output_type == "display_data"]
    assert "image/png" in shown[0].data
    assert "| mean reward |" in shown[1].data["text/markdown"]
    assert not any(o.output_type == "error" for c in code_cells for o in c.outputs)
