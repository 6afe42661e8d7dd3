"""index.html for the tour, generated from the tour's data; every number shown is registered so that
the JSON beside the page holds exactly the numbers the page shows (the tests check both)."""

from __future__ import annotations

import html
from pathlib import Path

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1040px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.5}
h1{font-size:1.9em;margin-bottom:.2em} h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2.2em}
.lead{color:#555} img{max-width:100%;border:1px solid #eee;margin:.6em 0} table{border-collapse:collapse;margin:.8em 0}
td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right} th{background:#f6f6f6} td:first-child,th:first-child{text-align:left}
.num{font-variant-numeric:tabular-nums;font-weight:600} pre{background:#f6f6f6;padding:.8em;overflow-x:auto;font-size:.85em}
.ok{color:#1a7f37} .bad{color:#b42318} .note{font-size:.9em;color:#555}
"""

CHECK_IMAGES = """
window.addEventListener('load', () => {
  const imgs = [...document.images];
  const ok = imgs.filter(i => i.complete && i.naturalWidth > 0).length;
  document.body.dataset.images = ok + '/' + imgs.length;
});
"""


class Page:
    def __init__(self):
        self.parts: list[str] = []
        self.shown: dict[str, dict] = {}

    def num(self, key: str, value, fmt: str = "{:.4g}") -> str:
        text = fmt.format(value) if not isinstance(value, str) else value
        self.shown[key] = {"value": value, "text": text}
        return f'<span class="num" data-key="{html.escape(key)}">{html.escape(text)}</span>'

    def add(self, s: str) -> None:
        self.parts.append(s)

    def img(self, name: str, alt: str) -> None:
        self.add(f'<img src="figures/{html.escape(name)}" alt="{html.escape(alt)}">')

    def table(self, header: list[str], rows: list[list[str]]) -> None:
        h = "".join(f"<th>{c}</th>" for c in header)
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
        self.add(f"<table><tr>{h}</tr>{body}</table>")

    def render(self, title: str) -> str:
        return (f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<style>{CSS}</style></head><body>{''.join(self.parts)}<script>{CHECK_IMAGES}</script></body></html>")


def build(data: dict, figures: dict[str, str]) -> Page:
    """The page: its header, then one section per part of the tour (each reads its own part of ``data``)."""
    p = Page()
    _header(p, data["meta"])
    for key, section in SECTIONS:
        section(p, data[key], figures)
    _diagrams(p, figures)
    return p


def _header(p: Page, meta: dict) -> None:
    """The title, and where the numbers came from: seed, torch, threads, backend, time."""
    p.add("<h1>addnorm tour: Add &amp; Norm, measured</h1>")
    p.add(f"<p class='lead'>Every number on this page was computed by <code>addnorm tour</code> on this machine "
          f"(seed {p.num('meta.seed', meta['seed'], '{}')}, torch {html.escape(meta['torch'])}, "
          f"{p.num('meta.threads', meta['threads'], '{}')} threads, Add &amp; Norm backend "
          f"<code>{html.escape(meta['backend'])}</code>), in {p.num('meta.seconds', meta['seconds'], '{:.1f}')} s. "
          "The same numbers are in <code>tour.json</code> beside this page.</p>")


def _pipeline(p: Page, d: dict, figures: dict[str, str]) -> None:
    """1. The Add & Norm pipeline on one real vector, and a wild one."""
    p.add("<h2>1. The Add &amp; Norm pipeline on one real vector</h2>")
    p.add(f"<p>The sentence <em>{html.escape(' '.join(d['tokens']))}</em> is embedded and passed through a real causal "
          f"self-attention sub-layer F. One position's 64 features go through the four stages:</p>")
    p.table(["stage", "mean", "std"], [[html.escape(s["name"]), p.num(f"pipeline.{i}.mean", s["mean"], "{:+.4f}"),
                                        p.num(f"pipeline.{i}.std", s["std"], "{:.4f}")] for i, s in enumerate(d["stages"])])
    p.img(figures["pipeline"], "histograms of the four stages")
    w = d["wild"]
    p.add(f"<p>A “wild” vector (N(5, 10²), seed 000): mean {p.num('wild.before_mean', w['before_mean'], '{:.3f}')}, "
          f"std {p.num('wild.before_std', w['before_std'], '{:.3f}')} → after LayerNorm mean "
          f"{p.num('wild.after_mean', w['after_mean'], '{:.1e}')}, std {p.num('wild.after_std', w['after_std'], '{:.5f}')} "
          "(just below 1: ε sits inside the square root).</p>")
    p.img(figures["wild"], "wild vector before and after LayerNorm")


def _seed001(p: Page, d: dict, figures: dict[str, str]) -> None:
    """2. Seed 001 in pure Python, with its cross-check against PyTorch."""
    p.add("<h2>2. Seed 001 in pure Python: a tiny transformer step by step</h2>")
    p.add("<p>Five tokens, d_model 16, two causal heads, a GELU feed-forward, the residual Add and LayerNorm — all in "
          "Python lists (<code>addnorm.reference.pure_python</code>). The detailed calculation for position "
          f"{p.num('seed001.position', d['position'], '{}')}:</p>")
    p.add("<pre>" + html.escape("\n".join(d["trace"])) + "</pre>")
    p.table(["position", "token", "mean before", "variance before", "mean after", "variance after"],
            [[str(r["position"]), html.escape(r["token"]), p.num(f"seed001.{i}.input_mean", r["input_mean"], "{:+.6f}"),
              p.num(f"seed001.{i}.input_variance", r["input_variance"], "{:.6f}"),
              p.num(f"seed001.{i}.output_mean", r["output_mean"], "{:+.1e}"),
              p.num(f"seed001.{i}.output_variance", r["output_variance"], "{:.6f}")] for i, r in enumerate(d["verification"])])
    cc = d["cross_check"]
    p.add("<p>Cross-check against PyTorch (float64, same weights): largest difference per stage — attention "
          f"{p.num('seed001.check.attention', cc['multi_head_output'], '{:.1e}')}, FFN "
          f"{p.num('seed001.check.ffn', cc['ffn_output'], '{:.1e}')}, residual {p.num('seed001.check.residual', cc['residual'], '{:.1e}')}, "
          f"LayerNorm {p.num('seed001.check.layer_norm', cc['layer_norm_output'], '{:.1e}')}.</p>")
    p.img(figures["seed001"], "variance before and after")


def _batchnorm(p: Page, d: dict, figures: dict[str, str]) -> None:
    """3. LayerNorm vs BatchNorm: what each normalizes over, and what changes their outputs."""
    o, c, pad, m = d["normalizes_over"], d["composition"], d["padding"], d["mode"]
    p.add("<h2>3. LayerNorm vs BatchNorm, measured</h2>")
    p.add(f"<p>On a batch of shape {html.escape(str(tuple(d['shape'])))}: LayerNorm makes every <b>token</b> mean 0 "
          f"(largest |row mean| {p.num('bn.layer_row_mean', o['layer_row_mean_max'], '{:.1e}')}) and std 1 "
          f"({p.num('bn.layer_row_std', o['layer_row_std_mean'], '{:.4f}')}); BatchNorm makes every <b>feature</b> mean 0 "
          f"over the batch ({p.num('bn.batch_feature_mean', o['batch_feature_mean_max'], '{:.1e}')}) but leaves token rows "
          f"off-centre (|row mean| up to {p.num('bn.batch_row_mean', o['batch_row_mean_max'], '{:.3f}')}).</p>")
    p.table(["what changes", "LayerNorm: max |Δ output|", "BatchNorm: max |Δ output|"], [
        ["the other sequences in the batch", p.num("bn.comp.layer", c["layer_batch_a_vs_batch_b_max_diff"], "{:.1e}"),
         p.num("bn.comp.batch", c["batch_batch_a_vs_batch_b_max_diff"], "{:.3f}")],
        [f"padding ({p.num('bn.pad.fraction', pad['pad_fraction'], '{:.0%}')} of positions)",
         p.num("bn.pad.layer", pad["layer_padded_vs_unpadded_max_diff"], "{:.1e}"),
         p.num("bn.pad.batch", pad["batch_padded_vs_unpadded_max_diff"], "{:.3f}")],
        ["train() vs eval()", p.num("bn.mode.layer", m["layer_train_vs_eval_max_diff"], "{:.1e}"),
         p.num("bn.mode.batch", m["batch_train_vs_eval_max_diff"], "{:.3f}")],
        ["one token alone (batch size 1)", p.num("bn.single.layer", c["layer_token_alone_vs_batch_max_diff"], "{:.1e}"),
         html.escape(str(c["batch_single_token"]))],
    ])
    p.img(figures["batchnorm"], "LayerNorm vs BatchNorm")


def _rms_vs_layer(p: Page, d: dict, figures: dict[str, str]) -> None:
    """4. LayerNorm vs RMSNorm: output statistics and speed."""
    p.add("<h2>4. LayerNorm vs RMSNorm</h2>")
    rows = []
    for case in ("real", "shifted"):
        for name, st in d["stats"][case].items():
            rows.append([f"{case}: {name}", p.num(f"rms.{case}.{name}.mean", st["row_mean"], "{:+.4f}"),
                         p.num(f"rms.{case}.{name}.std", st["row_std"], "{:.4f}"), p.num(f"rms.{case}.{name}.rms", st["row_rms"], "{:.4f}")])
    p.add("<p>Output statistics per token (averaged over tokens) on a GPT's residual stream over real text — as is, "
          "and with +0.5 added to every feature. LayerNorm removes the mean; RMSNorm keeps it and fixes the RMS at 1:</p>")
    p.table(["input", "row mean", "row std", "row RMS"], rows)
    sp = next(iter(d["speed"].items()))
    p.add(f"<p>Speed at {html.escape(sp[0])} float32 (Add &amp; Norm, median): addnorm LayerNorm "
          f"{p.num('rms.speed.layer_addnorm', sp[1]['layer_addnorm_ms'], '{:.3f}')} ms, RMSNorm "
          f"{p.num('rms.speed.rms_addnorm', sp[1]['rms_addnorm_ms'], '{:.3f}')} ms; eager PyTorch LayerNorm "
          f"{p.num('rms.speed.layer_eager', sp[1]['layer_eager_ms'], '{:.3f}')} ms, RMSNorm "
          f"{p.num('rms.speed.rms_eager', sp[1]['rms_eager_ms'], '{:.3f}')} ms "
          f"({html.escape(d.get('speed_method', ''))}).</p>")
    p.img(figures["rms_vs_layer"], "LayerNorm vs RMSNorm statistics")


def _gradient_flow(p: Page, d: dict, figures: dict[str, str]) -> None:
    """5. Gradient flow with and without residuals, at initialisation and trained."""
    p.add(f"<h2>5. Gradient flow with and without residuals ({p.num('flow.depth', d['depth'], '{}')} blocks)</h2>")
    p.add("<p>Real forward/backward passes on bytes of the Python standard library, measured with "
          "<code>addnorm.diagnostics</code> (not simulated): the norm of ∂loss/∂(residual stream) entering each block.</p>")
    p.table(["placement", "‖g‖ first block", "‖g‖ last block", "first ÷ last", "block 1 ÷ last", "max ÷ min",
             "parameter ‖∇W‖ last ÷ block 1"],
            [[html.escape(r["placement"]), p.num(f"flow.{r['placement']}.first", r["grad_first"], "{:.3g}"),
              p.num(f"flow.{r['placement']}.last", r["grad_last"], "{:.3g}"),
              p.num(f"flow.{r['placement']}.ratio", r["grad_first_over_last"], "{:.3g}"),
              p.num(f"flow.{r['placement']}.inner_ratio", r["grad_second_over_last"], "{:.3g}"),
              p.num(f"flow.{r['placement']}.spread", r["grad_max_over_min"], "{:.3g}"),
              p.num(f"flow.{r['placement']}.param_ratio", r["param_grad_last_over_second"], "{:.3g}")]
             for r in d["placements"]])
    p.add(f"<p class='note'>GPT-2 initialisation, d_model {d['config']['d_model']}, {d['config']['n_head']} heads, "
          f"batch {d['config']['batch']}×{d['config']['seq_len']} bytes. Block 0's input is the embedding "
          "(RMS ≈ 0.03), so post-norm's first LayerNorm rescales it ~30×: compare blocks 1…N−1 in the figure.</p>")
    p.img(figures["grad_norm"], "gradient norm vs depth")
    p.img(figures["stream_rms"], "residual stream RMS vs depth")
    flow = {r["placement"]: r for r in d["placements"]}
    if "no_residual" in flow and "pre" in flow:
        nr = flow["no_residual"]["grad_first_over_last"]
        p.add(f"<p>Without the residual path the first block's gradient is {p.num('flow.claim.no_residual', nr, '{:.3g}')}× "
              "the last block's: orders of magnitude out of balance (which way depends on how the branch's output "
              "compares with LayerNorm's ε; at width 64 it vanishes instead — see the README). With a residual the "
              f"profile stays bounded: pre-norm varies by {p.num('flow.claim.pre', flow['pre']['grad_max_over_min'], '{:.3g}')}× "
              "over the whole stack.</p>")
    tr = d.get("trained", [])
    if tr:
        p.add(f"<p>After {tr[0]['steps']} AdamW training steps (same stack, real data) post- and pre-norm separate the "
              "way Xiong et al. (2020) predict — post-norm's gradient is largest near the output:</p>")
        p.table(["placement", "‖g‖ block 1 ÷ last", "‖g‖ last ÷ smallest (block)", "loss"],
                [[html.escape(t["placement"]), p.num(f"flow.trained.{t['placement']}.b1_last", t["block1_over_last"], "{:.3g}"),
                  p.num(f"flow.trained.{t['placement']}.last_min", t["last_over_min"], "{:.3g}") + f" ({t['min_block']})",
                  p.num(f"flow.trained.{t['placement']}.loss_start", t["loss_start"], "{:.3f}") + " → "
                  + p.num(f"flow.trained.{t['placement']}.loss_end", t["loss_end"], "{:.3f}")] for t in tr])
        for name in d.get("training_figures", []):
            p.img(name, f"{name}: gradient norm vs depth over training steps")


def _block(p: Page, d: dict, figures: dict[str, str]) -> None:
    """6. The complete transformer block."""
    p.add("<h2>6. The complete transformer block</h2>")
    p.add(f"<p>Pre-norm block, d_model 512, 8 heads, d_ff 2048: input {html.escape(str(tuple(d['input_shape'])))} → output "
          f"{html.escape(str(tuple(d['output_shape'])))} (shape preserved); "
          f"{p.num('block.params', d['block_parameters'], '{:,}')} parameters (seed 000: {d['seed000_expected']:,}); "
          f"seed 002's attention sub-layer: {p.num('block.attn_sublayer', d['attention_sublayer_parameters'], '{:,}')} "
          f"(seed: {d['seed002_expected']:,}); mean |output − input| = "
          f"{p.num('block.diff', d['mean_abs_difference'], '{:.4f}')}.</p>")


def _pitfall(p: Page, d: dict, figures: dict[str, str]) -> None:
    """7. The tutorial pitfall against torch.nn.LayerNorm."""
    p.add("<h2>7. The tutorial pitfall</h2>")
    p.add("<p>Seed 000's LayerNorm divides by the <em>unbiased</em> std plus ε (ε outside the root). Against "
          "<code>torch.nn.LayerNorm</code> at D = 768:</p>")
    p.table(["input std", "max |Δ|", "std ratio", "torch output std"],
            [[f"{r['input_std']:g}", p.num(f"pitfall.{i}.diff", r["max_abs_diff"], "{:.3g}"),
              p.num(f"pitfall.{i}.ratio", r["std_ratio"], "{:.4f}"), p.num(f"pitfall.{i}.torch_std", r["torch_output_std"], "{:.4f}")]
             for i, r in enumerate(d["rows"])])
    p.img(figures["pitfall"], "tutorial pitfall")


def _training(p: Page, d: dict, figures: dict[str, str]) -> None:
    """Training: post-norm vs pre-norm, with and without warmup."""
    p.add("<h2>Training: post-norm vs pre-norm, with and without warmup</h2>")
    p.add(f"<p>Four real training runs of a {p.num('train.depth', d['depth'], '{}')}-layer byte-level GPT "
          f"(d_model {d['d_model']}, AdamW, lr {d.get('lr', 3e-3):g}, {p.num('train.steps', d['steps'], '{}')} steps, "
          f"seed {p.num('train.seed', d['seed'], '{}')}) on {html.escape(d['corpus'])}, split by file. Each final "
          f"loss is the study's: the held-out test split read whole "
          f"({p.num('train.val_bytes', d['val_bytes'], '{:,}')} predicted bytes, files no run trains on). A run "
          "fails when its loss spikes above 1.5× the mean of its previous 20 steps, turns non-finite, or ends at or "
          f"above the unigram plateau ({p.num('train.unigram', d['unigram_nats'], '{:.3f}')} nats: byte "
          f"frequencies alone); a run that ends within {d.get('stuck_fraction', 0.02):.0%} of the plateau is stuck "
          "there. At 24 layers and 500 steps the same failure is the study's <code>plateau</code> (post-norm fails "
          "there at every learning rate); see <code>addnorm study --preset paper</code>.</p>")
    p.add("<p class='note'>Measured at seeds 0, 1 and 2 (docs/study.md, “The tour's training section”): post-norm "
          "failed at every seed, with and without warmup, and pre-norm trained at every seed. How far pre-norm "
          "ends below post-norm without warmup depends on the seed (at one of the three it barely cleared the stuck "
          "line); with 50 warmup steps it ended far below at all three. <code>addnorm tour --seed N</code> runs "
          "this section at another seed.</p>")
    rows = []
    for i, r in enumerate(d["runs"]):
        outcome = (f"<span class='bad'>{html.escape(r['failure'])} at step {p.num(f'train.{i}.steps', r['steps_done'], '{}')}"
                   "</span>" if r["failed"] else "<span class='bad'>stuck at the unigram plateau</span>"
                   if r.get("stuck") else "<span class='ok'>trains</span>")
        rows.append([f"{r['placement']}-norm", p.num(f"train.{i}.warmup", r["warmup"], "{}"), outcome,
                     p.num(f"train.{i}.val", r["final_val_loss"], "{:.3f}")])
    p.table(["placement", "warmup steps", "outcome", "final loss, held-out test split"], rows)
    p.img(figures["training"], "training loss, post vs pre, with and without warmup")


def _diagrams(p: Page, figures: dict[str, str]) -> None:
    """8. Pre-norm vs post-norm drawn, and (9.) the frontier placements where the tour drew them."""
    p.add("<h2>8. Pre-norm vs post-norm</h2>")
    p.img(figures["diagrams"], "pre-norm and post-norm diagrams")
    p.add("<p class='note'>Drawn by <code>addnorm.report.figures.placement_diagrams</code>; an SVG version is beside the PNG.</p>")
    if "frontier_diagrams" in figures:
        p.add("<h2>9. Beyond pre-norm: the frontier placements</h2>")
        p.img(figures["frontier_diagrams"], "widened streams (HC, mHC, mHC-lite), LNS, DenseFormer, HybridNorm, nGPT, "
              "value residual")
        p.add("<p class='note'>Each is a placement of <code>GPTConfig</code> (<code>hc</code>, <code>mhc</code>, "
              "<code>mhc_lite</code>, <code>lns</code>, <code>denseformer</code>, <code>hybrid</code>, <code>ngpt</code>; "
              "<code>value_residual=True</code> with any of them), tested against a float64 transcription of its "
              "paper; see docs/frontier.md. Drawn by <code>addnorm.report.frontier_diagrams</code>.</p>")


# the tour's parts in the page's order: (key of the tour's data, the section that shows it)
SECTIONS = [("pipeline", _pipeline), ("seed001", _seed001), ("batchnorm", _batchnorm), ("rms_vs_layer", _rms_vs_layer),
            ("gradient_flow", _gradient_flow), ("block", _block), ("pitfall", _pitfall), ("training", _training)]


def write(data: dict, figures: dict[str, str], out_dir: Path) -> tuple[Path, dict]:
    page = build(data, figures)
    path = Path(out_dir) / "index.html"
    path.write_text(page.render("addnorm tour"), encoding="utf-8")
    return path, page.shown
