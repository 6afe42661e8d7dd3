"""Confirmation runs: the settings a claims preset's paired claims are tested at, run again at more seeds.

A claim paired by seed alone (``Spec.confirmed``) is tested with the exact sign-flip test, whose smallest p is
2/2^n: 0.0625 with the presets' 5 seeds, above alpha whatever the effect. So each side's setting -- for a tuned side
the one its runs at the selection seeds chose (``claims.tuned``: the lowest mean final dev loss over seeds 0-4) --
is trained again at the confirmation seeds (5-10), and the claim is tested on all 11 (2/2^11 < 0.05/39).
The choice reads only the selection seeds, so the extra runs cannot move it; a claim pooled or paired over the grid
never reads them (``claims.selection_seeds``).

``plan`` needs a tuned side's selection runs finished (its choice is made on them) and names each claim it cannot
plan yet; an untuned side's setting is the preset's own. The confirmation runs are a ``Study`` of one grid per
setting, run and sharded as any study (``grid.run_study``) into the preset's results directory.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .claims import SPECS, Spec, matches, setting_row, tuned, unconfirmable
from .config import CONFIRM_SEEDS, PRESETS, RunConfig, Study, StudyGrid, as_study


@dataclass(frozen=True)
class Side:
    """One side of a confirmed claim: the preset's runs it selects (every learning rate and seed of its grid)."""

    claim: str
    role: str  # "arm" or "baseline"
    tune: tuple[str, ...]
    runs: tuple[RunConfig, ...]

    @property
    def settings(self) -> list[RunConfig]:
        """Its settings, each as its run at its first seed, in the grid's order."""
        first: dict[RunConfig, RunConfig] = {}
        for r in sorted(self.runs, key=lambda r: r.seed):
            first.setdefault(_setting(r), r)
        return list(first.values())


@dataclass(frozen=True)
class Plan:
    """The confirmation runs of one preset: one grid per setting at the confirmation seeds, and the claims not planned,
    each as 'claim: why' -- ``skipped``: they cannot be (``sides``); ``waiting``: not yet, their selection runs are
    not all finished."""

    grids: tuple[StudyGrid, ...]
    claims: tuple[str, ...]  # the claims planned
    skipped: tuple[str, ...]
    waiting: tuple[str, ...]

    @property
    def study(self) -> Study:
        return Study(self.grids)

    def runs(self) -> list[RunConfig]:
        return self.study.runs() if self.grids else []


def _setting(cfg: RunConfig) -> RunConfig:
    """A run's setting: the run with its seed set aside (to 0)."""
    return replace(cfg, seed=0)


def at_seeds(cfg: RunConfig, seeds) -> StudyGrid:
    """One setting at ``seeds``: a grid with one value on every axis but the seed (its runs are ``cfg`` at each
    seed)."""
    return StudyGrid(placements=(cfg.placement,), norms=(cfg.norm,), depths=(cfg.depth,), lrs=(cfg.lr,),
                     warmups=(cfg.warmup,), seeds=tuple(seeds), clips=(cfg.clip,), inits=(cfg.init,), base=cfg,
                     n_streams=(cfg.n_streams,), value_residuals=(cfg.value_residual,), dyt_alphas=(cfg.dyt_alpha,),
                     embed_scales=(cfg.embed_scale,))


def sides(preset: str, specs: tuple[Spec, ...] = SPECS) -> tuple[list[tuple[Side, Side]], list[str]]:
    """The two sides of each claim of ``preset`` that the confirmation runs serve, and the claims paired by seed they
    cannot serve ('claim: why', ``claims.unconfirmable``)."""
    grid = as_study(PRESETS[preset]).runs()
    out, skipped = [], []
    for spec in specs:
        if spec.preset != preset or not spec.confirmed:
            continue
        why = unconfirmable(spec)
        if why:
            skipped.append(f"{spec.id}: {'; '.join(why)}")
            continue
        out.append(tuple(Side(spec.id, role, spec.tune,
                              tuple(r for r in grid if matches(setting_row(r.__dict__), select)))
                         for role, select in (("arm", spec.arm), ("baseline", spec.baseline))))
    return out, skipped


def chosen(side: Side, rows: list[dict]) -> list[RunConfig]:
    """The setting(s) ``side`` is tested at, each as its run at the first seed: the preset's for an untuned side;
    for a tuned one, the setting ``claims.tuned`` chooses from its finished runs (``rows``, by name).
    LookupError naming the runs not finished where its selection runs are not all there."""
    if not side.tune:
        return side.settings
    by_name = {r["name"]: r for r in rows}
    missing = [r.name() for r in side.runs if r.name() not in by_name]
    if missing:
        named = ", ".join(missing[:2]) + (", ..." if len(missing) > 2 else "")
        raise LookupError(f"the {side.role}'s setting cannot be chosen yet: {len(missing)} of its {len(side.runs)} "
                          f"selection runs are not finished ({named})")
    kept, _ = tuned([by_name[r.name()] for r in side.runs], side.tune)
    names = {r["name"] for r in kept}
    best = {_setting(r) for r in side.runs if r.name() in names}
    return [s for s in side.settings if _setting(s) in best]


def plan(preset: str, rows: list[dict], seeds=CONFIRM_SEEDS, specs: tuple[Spec, ...] = SPECS) -> Plan:
    """The confirmation runs of ``preset`` from its finished runs (``claims.run_rows`` of its results directory): the
    setting of each side of each confirmed claim at ``seeds``, each setting once (claims that share a side, or whose
    tuned sides chose alike, share its runs)."""
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(sorted(PRESETS))}, got {preset!r}")
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be integers >= 0, got {seeds!r}")
    pairs, skipped = sides(preset, specs)
    settings: dict[RunConfig, RunConfig] = {}
    planned, waiting = [], []
    for arm, baseline in pairs:
        both, why = [], []
        for side in (arm, baseline):
            try:
                both += chosen(side, rows)
            except LookupError as e:
                why.append(str(e))
        if why:
            waiting.append(f"{arm.claim}: {'; '.join(why)}")
            continue
        planned.append(arm.claim)
        for s in both:
            settings.setdefault(_setting(s), s)
    grids = tuple(at_seeds(s, seeds) for s in settings.values())
    return Plan(grids, tuple(planned), tuple(skipped), tuple(waiting))


def most(preset: str, seeds=CONFIRM_SEEDS, specs: tuple[Spec, ...] = SPECS) -> Study | None:
    """The most confirmation runs ``preset`` can need, before any run exists: one setting per distinct side (a tuned
    side's runs cost the same at every learning rate and warmup, so its first setting prices it); two sides that
    choose alike run once, so this is an upper bound. None where it has no claim to confirm."""
    pairs, _ = sides(preset, specs)
    distinct = {}
    for side in (s for pair in pairs for s in pair):
        distinct.setdefault((frozenset(map(_setting, side.runs)), side.tune), side.settings[0])
    return Study(tuple(at_seeds(s, seeds) for s in distinct.values())) if distinct else None
