"""A study run's configuration (everything that changes its result), presets, and grid expansion."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import asdict, dataclass, field, fields

from ...model.config import DYT_ALPHA, ConfigError, GPTConfig
from ...model.gpt2_init import STD as EMBED_STD
from ...model.placement import NAMES, PLACEMENTS

NORMS = ("layer", "rms", "dyt", "derf", "batch")
INITS = ("gpt2", "xavier")
DYT_PAPER_ALPHA = (0.8, 0.2, 0.2)  # DyT's LLaMA-2 7B alpha0 per slot: attention, FFN, final (Zhu et al. 2025)
# fields added after runs were cached: left out of the cache key and the name while at these defaults, so that
# every run finished before they existed keeps its key and its directory
_LATER_DEFAULTS = {"n_streams": None, "value_residual": False, "dyt_alpha": DYT_ALPHA, "until_flat": False,
                   "embed_scale": None}
# the DyT/Derf audit's embedding scales (GPTConfig.embed_scale: a learned scalar on the token embedding, starting
# here): the DyT paper's LLaMA code starts it at sqrt(d_model); UNIT_RMS starts the token embedding (N(0, 0.02) at
# both inits) at RMS 1, LayerNorm's output scale, so that tanh(alpha x) starts where the paper's models start
UNIT_RMS = 1.0 / EMBED_STD  # 50


class StudyConfigError(ValueError):
    """An invalid value; ``field`` names it (the command line maps it to its option)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message


def _int(name, v, lo):
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise StudyConfigError(name, f"must be an integer >= {lo}, got {v!r}")



def _num(v: float) -> str:
    """A number in a run's name: 6 significant digits (the names runs have always had) where they give the number
    back, every digit where they do not -- lr 0.001 and 0.0010000001 got one name, and one run's results."""
    short = f"{v:g}"
    return short if float(short) == v else repr(float(v))

@dataclass(frozen=True)
class RunConfig:
    """One training run: a byte-level GPT trained with AdamW(0.9, 0.98), no weight decay, linear warmup then
    cosine decay to 10 % of ``lr``."""

    placement: str | tuple[str, ...] = "pre"  # a name, or one per layer
    norm: str = "layer"
    depth: int = 6
    d_model: int = 64
    heads: int = 4
    seq_len: int = 64
    batch: int = 16
    steps: int = 300
    lr: float = 3e-3
    warmup: int = 0
    clip: float = 0.0  # gradient-norm clipping; 0 = off
    init: str = "xavier"  # "gpt2": N(0, 0.02), residual projections / sqrt(2L); "xavier": Xavier-normal Linears
    seed: int = 0
    eval_every: int = 50
    eval_batches: int = 4
    checkpoint_every: int = 50
    n_streams: int | None = None  # width of a widened stream (hc, mhc, mhc_lite); None: the model's default (4)
    value_residual: bool = False  # ResFormer's value residual (every layer's values mixed with layer 1's)
    dyt_alpha: float | tuple[float, float, float] = DYT_ALPHA  # DyT/Derf alpha0: one, or (attention, FFN, final)
    until_flat: bool = False  # stop at the first evaluation where the validation curve has flattened (see flat.py);
    #                           ``steps`` is then the cap (and the cosine schedule's length)
    embed_scale: float | None = None  # a learned scalar on the token embedding starting at this value (sqrt(d_model):
    #                                   the DyT paper's LLaMA code; UNIT_RMS: embeddings at RMS 1); None: no scale

    def __post_init__(self):
        p = self.placement
        if isinstance(p, list):
            object.__setattr__(self, "placement", tuple(p))
            p = self.placement
        names = p if isinstance(p, tuple) else (p,)
        bad = [n for n in names if n not in NAMES]
        if bad or not names:
            raise StudyConfigError("placement", f"unknown {bad or 'empty'}; valid: {', '.join(NAMES)}")
        if isinstance(p, tuple) and len(p) != self.depth:
            raise StudyConfigError("placement", f"a per-layer list needs {self.depth} names (depth), got {len(p)}")
        if self.norm not in NORMS:
            raise StudyConfigError("norm", f"must be one of {NORMS}, got {self.norm!r}")
        if self.init not in INITS:
            raise StudyConfigError("init", f"must be one of {INITS}, got {self.init!r}")
        for name in ("depth", "d_model", "heads", "seq_len", "batch", "steps", "eval_every", "eval_batches",
                     "checkpoint_every"):
            _int(name, getattr(self, name), 1)
        _int("warmup", self.warmup, 0)
        if self.warmup >= self.steps:  # the run would never reach its learning rate: its lr label would be false
            raise StudyConfigError("warmup", f"{self.warmup} must be smaller than steps ({self.steps})")
        _int("seed", self.seed, 0)
        if self.d_model % self.heads:
            raise StudyConfigError("d_model", f"{self.d_model} must be divisible by heads ({self.heads})")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise StudyConfigError("lr", f"must be a finite number > 0, got {self.lr!r}")
        if not (isinstance(self.clip, int | float) and math.isfinite(self.clip) and self.clip >= 0):
            raise StudyConfigError("clip", f"must be a finite number >= 0 (0: off), got {self.clip!r}")
        if isinstance(self.dyt_alpha, list):
            object.__setattr__(self, "dyt_alpha", tuple(self.dyt_alpha))
        a = self.dyt_alpha
        if any(isinstance(v, bool) or not isinstance(v, int | float) or not v > 0 for v in
               (a if isinstance(a, tuple) else (a,))):
            raise StudyConfigError("dyt_alpha", f"must be numbers > 0, got {a!r}")
        if not isinstance(self.until_flat, bool):
            raise StudyConfigError("until_flat", f"must be True or False, got {self.until_flat!r}")
        e = self.embed_scale
        if e is not None and (isinstance(e, bool) or not isinstance(e, int | float) or not math.isfinite(e) or e <= 0):
            raise StudyConfigError("embed_scale", f"must be a finite number > 0 or None (off), got {e!r}")
        if e is not None:
            object.__setattr__(self, "embed_scale", float(e))  # 8 and 8.0: one run, one key
        if self.placement == "ngpt" and e is not None:
            raise StudyConfigError("embed_scale", "nGPT's stream starts on the unit sphere and takes no embedding "
                                                  f"scale, got {e!r}")
        try:  # the model's own checks: n_streams on a single stream, a non-integer width, ...
            self.gpt_config()
        except ConfigError as e:
            field, _, rest = str(e).partition(" ")
            name = field.partition("=")[0]
            raise StudyConfigError(name if name in _LATER_DEFAULTS or name in ("placement", "norm") else "placement",
                                   rest if name == field else str(e)) from None

    def gpt_config(self) -> GPTConfig:
        """The model this run trains: a byte-level GPT without dropout."""
        return GPTConfig(vocab_size=256, block_size=self.seq_len, n_layer=self.depth, n_head=self.heads,
                         n_embd=self.d_model, dropout=0.0, norm=None if self.placement == "ngpt" else self.norm,
                         placement=self.placement, n_streams=self.n_streams, value_residual=self.value_residual,
                         dyt_alpha=self.dyt_alpha,
                         embed_scale=None if self.embed_scale is None else float(self.embed_scale))

    @property
    def widened(self) -> bool:
        names = self.placement if isinstance(self.placement, tuple) else (self.placement,)
        return any(n in PLACEMENTS and PLACEMENTS[n].widened for n in names)

    @property
    def bounded(self) -> bool:
        """Does the model have DyT/Derf norm slots (whose alpha0 is ``dyt_alpha``)?"""
        return self.norm in ("dyt", "derf") and self.placement != "ngpt"

    @property
    def placement_name(self) -> str:
        return self.placement if isinstance(self.placement, str) else "+".join(self.placement)

    def key(self, data_digest: str) -> str:
        """The cache key: every field (those added later only when not at their default) and the data's content
        hash (never its path)."""
        fields_ = {k: v for k, v in asdict(self).items() if _LATER_DEFAULTS.get(k, object()) != v}
        blob = json.dumps({**fields_, "data": data_digest}, sort_keys=True, default=list)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def name(self) -> str:
        return (f"{self.placement_name}-{self.norm}-L{self.depth}-lr{_num(self.lr)}-w{self.warmup}-s{self.seed}"
                f"-c{_num(self.clip)}-{self.init}{self.variant_suffix()}")

    def variant_suffix(self) -> str:
        """What sets this run apart beyond the name's fixed parts: '-d256-n2-vr-a0.8_0.2_0.2-flat-e8' (empty for a
        run at every default, so older runs keep their names)."""
        a = self.dyt_alpha
        parts = [f"d{self.d_model}" if self.d_model != 64 else "",
                 f"n{self.n_streams}" if self.n_streams is not None else "",
                 "vr" if self.value_residual else "",
                 "a" + "_".join(_num(v) for v in (a if isinstance(a, tuple) else (a,))) if a != DYT_ALPHA else "",
                 "flat" if self.until_flat else "",
                 f"e{_num(self.embed_scale)}" if self.embed_scale is not None else ""]
        return "".join(f"-{p}" for p in parts if p)


@dataclass(frozen=True)
class StudyGrid:
    """Axes of a grid; every combination is a run. ``base`` fixes everything else."""

    placements: tuple = ("post", "pre")
    norms: tuple[str, ...] = ("layer",)
    depths: tuple[int, ...] = (6,)
    lrs: tuple[float, ...] = (3e-3,)
    warmups: tuple[int, ...] = (0,)
    seeds: tuple[int, ...] = (0,)
    clips: tuple[float, ...] = (0.0,)
    inits: tuple[str, ...] = ("xavier",)
    base: RunConfig = field(default_factory=RunConfig)
    # the frontier's axes; None: the base's value
    n_streams: tuple[int | None, ...] | None = None  # widened placements only (the others ignore it)
    value_residuals: tuple[bool, ...] | None = None
    dyt_alphas: tuple[float | tuple[float, float, float], ...] | None = None  # DyT/Derf norms only
    embed_scales: tuple[float | None, ...] | None = None  # every placement but nGPT (None in it: off)

    def __post_init__(self):
        # every run takes these from the axes, never from ``base``: a base that sets one where its axis was left at
        # the grid's default would be silently replaced (a base of 12 layers trained at the default axis' 6). An axis
        # given explicitly overrides a shared base on purpose (the presets' 48-layer grids on a 24-layer base)
        default, grid_default = RunConfig(), {f.name: f.default for f in fields(StudyGrid)}
        for axis, name in _AXES:
            mine, values = getattr(self.base, name), getattr(self, axis)
            if values == grid_default[axis] and mine != getattr(default, name) and mine not in values:
                raise ValueError(f"StudyGrid: base.{name}={mine!r} would be replaced by the default "
                                 f"{axis}={values!r} in every run; give {axis}=({mine!r},)")

    def runs(self) -> list[RunConfig]:
        """Every combination, each once: an axis a run cannot use (n_streams on a single stream, alpha without a
        DyT/Derf norm, a norm kind or an embedding scale for nGPT) is set to its default there rather than giving
        copies of one run."""
        out = []
        b = self.base
        for p, n, d, lr, w, s, c, i, ns, vr, a, e in itertools.product(
                self.placements, self.norms, self.depths, self.lrs, self.warmups, self.seeds, self.clips, self.inits,
                self.n_streams or (b.n_streams,), self.value_residuals or (b.value_residual,),
                self.dyt_alphas or (b.dyt_alpha,), self.embed_scales or (b.embed_scale,)):
            kw = {f.name: getattr(b, f.name) for f in fields(RunConfig)}
            kw.update(placement=p, norm="layer" if p == "ngpt" else n, depth=d, lr=lr, warmup=w, seed=s, clip=c,
                      init=i, value_residual=vr, embed_scale=None if p == "ngpt" else e)
            probe = RunConfig(**{**kw, "n_streams": None, "dyt_alpha": DYT_ALPHA})
            kw.update(n_streams=ns if probe.widened else None, dyt_alpha=a if probe.bounded else DYT_ALPHA)
            out.append(RunConfig(**kw))
        return list(dict.fromkeys(out))

    def describe(self) -> str:
        axes = {k: v for k, v in asdict(self).items() if k != "base" and v is not None}
        b = self.base
        fixed = (f"d_model {b.d_model}, {b.heads} heads, seq {b.seq_len}, batch {b.batch}, {b.steps} steps, "
                 f"eval every {b.eval_every}" + (", until the validation curve flattens" if b.until_flat else ""))
        return "; ".join(f"{k}: {', '.join(map(_axis_text, v))}" for k, v in axes.items()) + f"  [{fixed}]"


# (StudyGrid axis, the RunConfig field it sets in every run)
_AXES = (("placements", "placement"), ("norms", "norm"), ("depths", "depth"), ("lrs", "lr"), ("warmups", "warmup"),
         ("seeds", "seed"), ("clips", "clip"), ("inits", "init"))


def _axis_text(v) -> str:
    return "/".join(f"{x:g}" for x in v) if isinstance(v, tuple | list) else "off" if v is None else str(v)


def _check_axes_used(parts: tuple[StudyGrid, ...]) -> None:
    """A frontier axis that no run of the study can use is a mistake in the command, not a silent no-op."""
    runs = [r for part in parts for r in part.runs()]
    if any(part.n_streams and any(v is not None for v in part.n_streams) for part in parts) and \
            not any(r.widened for r in runs):
        raise StudyConfigError("n_streams", "needs a widened-stream placement (hc, mhc, mhc_lite) in the grid")
    if any(part.dyt_alphas and any(v != DYT_ALPHA for v in part.dyt_alphas) for part in parts) and \
            not any(r.bounded for r in runs):
        raise StudyConfigError("dyt_alpha", "needs a DyT or Derf norm in the grid (--norms dyt or derf)")
    if any(part.embed_scales and any(v is not None for v in part.embed_scales) for part in parts) and \
            not any(r.embed_scale is not None for r in runs):
        raise StudyConfigError("embed_scale", "needs a placement other than ngpt in the grid")


@dataclass(frozen=True)
class Study:
    """A union of grids (for comparisons that are not one product, such as DyT beside the placements): the runs
    of every part in order, each once."""

    parts: tuple[StudyGrid, ...]

    @property
    def base(self) -> RunConfig:
        return self.parts[0].base

    def runs(self) -> list[RunConfig]:
        _check_axes_used(self.parts)
        seen, out = set(), []
        for part in self.parts:
            for r in part.runs():
                if r not in seen:
                    seen.add(r)
                    out.append(r)
        return out

    def describe(self) -> str:
        return " + ".join(f"({p.describe()})" for p in self.parts) if len(self.parts) > 1 else self.parts[0].describe()


def as_study(grid: StudyGrid | Study) -> Study:
    return grid if isinstance(grid, Study) else Study((grid,))


_DEEP = RunConfig(depth=24, steps=500, warmup=100, eval_every=50)
_DEEP_AXES = dict(depths=(24,), lrs=(3e-4, 1e-3, 3e-3, 1e-2), warmups=(100,), seeds=(0, 1, 2), base=_DEEP)
FRONTIER_FORMS = ("pre", "post", "sandwich", "deepnorm", "mix", "layerscale",
                  "hc", "mhc", "mhc_lite", "lns", "denseformer", "hybrid", "hybrid_star", "ngpt", "attn_res")
_FRONTIER_AXES = dict(depths=(24,), lrs=(1e-3, 3e-3), warmups=(100,), seeds=(0, 1, 2, 3, 4), base=_DEEP)
_LONG_AXES = dict(depths=(6,), lrs=(1e-3,), warmups=(100,), seeds=(0, 1, 2),
                  base=RunConfig(steps=10000, warmup=100, eval_every=100, checkpoint_every=500, until_flat=True))
_DYT_AXES = dict(depths=(6,), lrs=(1e-3, 3e-3), warmups=(50,), seeds=(0,),
                 base=RunConfig(steps=400, warmup=50, eval_every=50))
# the audit's cause: no embedding scale (today's stream, RMS 0.03 at init), the DyT paper's sqrt(d_model) and
# embeddings at RMS 1, for DyT and Derf at their default and the DyT paper's alpha0 and for LayerNorm, 5 seeds
EMBED_SCALES = (None, math.sqrt(_DYT_AXES["base"].d_model), UNIT_RMS)

PRESETS = {
    # about 1.5 minutes on 2 cores (measured: 83 s): post vs pre, with and without warmup, at 6 layers
    "quick": StudyGrid(placements=("post", "pre"), depths=(6,), lrs=(3e-3,), warmups=(0, 50), seeds=(0,),
                       base=RunConfig(steps=400, eval_every=50)),
    # under 25 minutes on 2 cores: Xiong et al.'s effect over 3 seeds at two learning rates
    "default": StudyGrid(placements=("post", "pre"), depths=(6,), lrs=(1e-3, 3e-3), warmups=(0, 100),
                         seeds=(0, 1, 2), base=RunConfig(steps=800, eval_every=100)),
    # hours (96 runs x 500 steps at 24 layers; the measured time is in docs/study.md): seven placements and DyT
    # (pre-norm with DyT in place of the norm) over a 30x learning-rate range, 3 seeds each
    "paper": Study((
        StudyGrid(placements=("post", "pre", "sandwich", "deepnorm", "mix", "rezero", "layerscale"), **_DEEP_AXES),
        StudyGrid(placements=("pre",), norms=("dyt",), **_DEEP_AXES),
    )),
    # the frontier forms beside the seeds' placements at the paper preset's depth, 5 seeds, two learning rates;
    # Derf, value residual and DyT with the DyT paper's per-slot alpha as pre-norm variants, and HybridNorm at its
    # paper's init beside pre and post at that init (220 runs; hours:
    # measured per-step times and the sharding command in docs/study.md)
    "frontier": Study((
        StudyGrid(placements=FRONTIER_FORMS, **_FRONTIER_AXES),
        StudyGrid(placements=("pre",), norms=("derf",), **_FRONTIER_AXES),
        StudyGrid(placements=("pre",), value_residuals=(True,), **_FRONTIER_AXES),
        StudyGrid(placements=("pre",), norms=("dyt",), dyt_alphas=(DYT_PAPER_ALPHA,), **_FRONTIER_AXES),
        # HybridNorm's paper trains with Megatron's init (N(0, 0.02), output projections / sqrt(2L): "gpt2" here);
        # at Xavier init and 24 layers it plateaus at the unigram loss as post-LN does. pre and post at the same
        # init are its baselines: pre for the loss, post to tell HybridNorm's own effect from the init's
        StudyGrid(placements=("pre", "post", "hybrid", "hybrid_star"), inits=("gpt2",), **_FRONTIER_AXES),
    )),
    # where each placement stops training as depth grows (the depth x placement map), 3 seeds
    "depth": StudyGrid(placements=("post", "pre", "deepnorm", "mix", "lns"), depths=(6, 12, 24, 48),
                       lrs=(1e-3, 3e-3), warmups=(100,), seeds=(0, 1, 2), base=_DEEP),
    # until the validation curve flattens (flat.py: < 1 % better over the last 20 % of the steps), at most
    # 10000 steps, 6 layers: where training ends rather than how fast it starts
    "long": Study((
        StudyGrid(placements=("post", "pre", "sandwich", "deepnorm", "mix", "layerscale", "lns", "mhc"),
                  **_LONG_AXES),
        StudyGrid(placements=("pre",), norms=("dyt",), **_LONG_AXES),
    )),
    # four times wider (d_model 256), 12 layers
    "wide": StudyGrid(placements=("post", "pre", "sandwich", "deepnorm", "mix", "layerscale", "lns", "mhc"),
                      depths=(12,), lrs=(1e-3,), warmups=(100,), seeds=(0, 1, 2),
                      base=RunConfig(d_model=256, depth=12, steps=1000, warmup=100, eval_every=100)),
    # the mHC claim: the composite mixing gain of HC vs mHC vs mHC-lite against depth and over training
    "mixing": StudyGrid(placements=("hc", "mhc", "mhc_lite"), depths=(6, 12, 24), lrs=(1e-3,), warmups=(100,),
                        seeds=(0, 1, 2), base=_DEEP),
    # the DyT/Derf audit: alpha0 from 0.2 to 8 and the DyT paper's per-slot values, beside LayerNorm, 6 layers
    # (one seed); then its cause: the token embedding's scale (none, sqrt(d_model) = 8, unit RMS = 50) for DyT and
    # Derf at alpha0 0.5 and 0.8/0.2/0.2 and for LayerNorm, 5 seeds (162 runs, 10 of them shared by both parts)
    "dyt": Study((
        StudyGrid(placements=("pre",), norms=("dyt", "derf"), dyt_alphas=(0.2, 0.5, DYT_PAPER_ALPHA, 2.0, 8.0),
                  **_DYT_AXES),
        StudyGrid(placements=("pre",), norms=("layer",), **_DYT_AXES),
        StudyGrid(placements=("pre",), norms=("dyt", "derf", "layer"), dyt_alphas=(0.5, DYT_PAPER_ALPHA),
                  embed_scales=EMBED_SCALES, **{**_DYT_AXES, "seeds": (0, 1, 2, 3, 4)}),
    )),
}

# The claims file's runs (experiments/study/claims.py), one preset per results directory: every final loss on the
# held-out test split (data.py), 5 seeds, each arm at three learning rates so that the dev split picks its best and
# says whether the grid brackets it, and GPT-2's init (N(0, 0.02), residual projections / sqrt(2L)) for every arm:
# the tuned baseline is GPT-2-init pre-LN. Where the committed runs put the optima: at 24 layers GPT-2-init pre-LN
# was better at 3e-3 than at 1e-3 (2.31 against 2.43 nats), HybridNorm the other way (2.48 against 3.24), nGPT at
# 3e-3 (1.94 against 2.87); 1e-2 was within 0.02 nats of 3e-3 for Xavier pre-LN and diverged or plateaued for Mix-LN
# and DeepNorm. 1e-3, 3e-3, 1e-2 brackets pre-LN's; an arm whose best is an end of it is said to be unbracketed.
CLAIM_SEEDS = (0, 1, 2, 3, 4)
# the confirmation seeds (experiments/study/confirm.py): each paired claim's settings -- a tuned side's chosen on
# CLAIM_SEEDS -- run again at these, so that the sign-flip test, whose smallest p is 2/2^n, can decide it
CONFIRM_SEEDS = (5, 6, 7, 8, 9, 10)
CLAIM_LRS = (1e-3, 3e-3, 1e-2)
_CLAIM = dict(lrs=CLAIM_LRS, seeds=CLAIM_SEEDS, inits=("gpt2",))
_CLAIM24 = dict(depths=(24,), warmups=(100,), base=_DEEP, **_CLAIM)
_CLAIM6 = dict(depths=(6,), base=RunConfig(steps=800, eval_every=100), **_CLAIM)

PRESETS.update({
    # the seeds' claims: post vs pre with and without warmup, RMSNorm and BatchNorm beside LayerNorm (6 layers,
    # 800 steps, as `default`), and no residual beside pre-LN at 12 layers (400 steps, as `study_residual`)
    "claims_seeds": Study((
        StudyGrid(placements=("post", "pre"), warmups=(0, 100), **_CLAIM6),
        StudyGrid(placements=("pre",), norms=("rms", "batch"), warmups=(100,), **_CLAIM6),
        StudyGrid(placements=("no_residual", "pre"), depths=(12,), warmups=(100,),
                  base=RunConfig(depth=12, steps=400, warmup=100, eval_every=50), **_CLAIM),
    )),
    # the placement and frontier claims at 24 layers, 500 steps, each form against GPT-2-init pre-LN; post for the
    # seeds' stability claim, DyT at the DyT paper's per-slot alpha0
    "claims_frontier": Study((
        StudyGrid(placements=("pre", "post", "mix", "lns", "denseformer", "hybrid", "hybrid_star", "ngpt"), **_CLAIM24),
        StudyGrid(placements=("pre",), value_residuals=(True,), **_CLAIM24),
        StudyGrid(placements=("pre",), norms=("derf",), **_CLAIM24),
        StudyGrid(placements=("pre",), norms=("dyt",), dyt_alphas=(DYT_PAPER_ALPHA,), **_CLAIM24),
    )),
    # DyT at its default alpha0 0.5 beside pre-LN at a small token budget (512k tokens, 24 layers): the first half
    # of the DyT-budget claims (the second: claims_long)
    "claims_dyt_budget": StudyGrid(placements=("pre",), norms=("layer", "dyt"), **_CLAIM24),
    # the DyT/Derf audit's cause (the dyt preset's embedding-scale arms, as a claims preset): DyT and Derf at their
    # default and the DyT paper's alpha0, and LayerNorm, each with no embedding scale, sqrt(d_model) and unit-RMS
    # embeddings; 6 layers, 400 steps, warmup 50 as the audit
    "claims_dyt_cause": StudyGrid(placements=("pre",), norms=("dyt", "derf", "layer"),
                                  dyt_alphas=(0.5, DYT_PAPER_ALPHA), embed_scales=EMBED_SCALES, depths=(6,),
                                  warmups=(50,), base=RunConfig(steps=400, warmup=50, eval_every=50), **_CLAIM),
    # where each form stops training: 48 layers
    "claims_depth": StudyGrid(placements=("post", "pre", "deepnorm", "mix", "lns"), depths=(48,), warmups=(100,),
                              base=_DEEP, **_CLAIM),
    # the composite mixing gain of HC and mHC against depth (not a loss: one learning rate, as `mixing`)
    "claims_mixing": Study((
        StudyGrid(placements=("hc",), depths=(6, 24), lrs=(1e-3,), warmups=(100,), seeds=CLAIM_SEEDS, inits=("gpt2",),
                  base=_DEEP),
        StudyGrid(placements=("mhc",), depths=(24,), lrs=(1e-3,), warmups=(100,), seeds=CLAIM_SEEDS,
                  inits=("gpt2",), base=_DEEP),
    )),
    # 20 times the tokens (until flat, at most 10000 steps, 6 layers) and four times the width (d_model 256)
    "claims_long": Study((
        StudyGrid(placements=("pre", "mix", "lns", "mhc"), **{**_LONG_AXES, **_CLAIM}),
        StudyGrid(placements=("pre",), norms=("dyt",), **{**_LONG_AXES, **_CLAIM}),
    )),
    "claims_wide": StudyGrid(placements=("post", "pre", "mix", "lns", "mhc"), depths=(12,), warmups=(100,),
                             base=RunConfig(d_model=256, depth=12, steps=1000, warmup=100, eval_every=100), **_CLAIM),
})
