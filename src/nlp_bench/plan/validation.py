"""How far to trust the planner: its constants fitted on the published corpus, its errors measured on whole
publications it was not fitted on (leave-one-source-out: rows of one source share a machine, a software
stack and a way of measuring, so a row's neighbours would predict it too well), and the ranges the corpus
covers.

The interval a prediction carries is a split-conformal 90% interval of those held-out errors: of n errors
sorted, from the k-th smallest to the k-th largest, k = n + 1 - ceil((n + 1) · 0.95). A new error
exchangeable with them lies inside with probability at least 0.90 (Vovk et al. 2005; Lei et al. 2018);
the 5th and 95th percentiles of the same errors would hold about 0.90 · (n - 1)/(n + 1) of new ones, 86% at
n = 40. Its coverage is checked the same way: each publication's rows against the interval the other
publications' errors give.

Publications are not the only thing a new prediction can be unlike: it can run on more GPUs than any row, or
on another system. So the corpus is held out three ways (`HELD_OUT`): by publication, by system profile,
and by scale band (each band predicted by a fit on the rows below it, as a user extrapolates to more GPUs
than were measured). The interval a prediction carries is the widest of the publication-held-out interval,
its scale band's and its system's (each from that way's held-out errors); one outside every fitted kind (a
scale above the corpus, a device the corpus lacks, any other extrapolation) carries the widest interval any
held-out kind gave.

Each held-out source refits the model, which takes seconds; the result depends only on the corpus file,
the system profiles and the model's code, so it is kept (results/plan/corpus-validation.json, keyed by a
digest of them) and recomputed only when one changes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nlp_bench import flops
from nlp_bench.errors import PlanError
from nlp_bench.fsio import write_json_atomic
from nlp_bench.plan import calibrate, candidate, corpus, memory, timing
from nlp_bench.plan.corpus import CorpusRow, Ranges, corpus_path, load_corpus, ranges
from nlp_bench.spec import devices, models, systems
from nlp_bench.spec.models import pad_vocab
from nlp_bench.spec.systems import System, systems_dir

#: The share of new rows an interval is to hold: half of the rest lies below it, half above.
COVERAGE = 0.90
_CACHE = "corpus-validation.json"
#: The ways the corpus is held out: whole publications, whole system profiles, whole scale bands.
HELD_OUT = ("publication", "system", "scale")
#: The scale bands' lower edges in GPUs of the whole run: a network's costs change with the nodes it spans
#: (intra-node, one leaf switch of a fat tree, several, thousands of GPUs), so each band is a kind of its own.
SCALE_EDGES = (1, 256, 1024, 4096)


def scale_band(devices: int) -> str:
    """The scale band a run of `devices` GPUs belongs to, in words ("1024-4095 GPUs")."""
    low = max(e for e in SCALE_EDGES if e <= max(devices, 1))
    higher = [e for e in SCALE_EDGES if e > low]
    return f"{low}-{higher[0] - 1} GPUs" if higher else f"{low}+ GPUs"


def _band_floor(band: str) -> int:
    return int(band.split("-")[0].split("+")[0])


def _work(row: CorpusRow) -> timing.Work:
    p = row.planned
    return timing.work(p.model, pad_vocab(p.model.vocab_size, p.candidate.layout.tp), p.candidate, p.system)


def _tokens(row: CorpusRow, w: timing.Work, eff: timing.Efficiency) -> float:
    return row.candidate.layout.global_batch_size * row.planned.model.seq_length / timing.timed(w, eff).iteration_s


def predict_row(row: CorpusRow, eff: timing.Efficiency) -> float:
    """Predicted tokens/s of a corpus row (time only: a published run evidently fitted in memory)."""
    return _tokens(row, _work(row), eff)


def fit_rows(rows: list[CorpusRow]) -> calibrate.Fit:
    """The constants fitted on `rows`, each publication weighing as one: its rows share a machine, a software
    stack and a way of measuring, so they are one piece of evidence, not as many as they are rows (the
    reason validation holds out whole publications); a source with many rows would otherwise set the
    constants for all."""
    works = [_work(r) for r in rows]
    per_publication = Counter(r.publication for r in rows)
    return calibrate.fit(lambda eff: [_tokens(r, w, eff) for r, w in zip(rows, works, strict=True)],
                         [r.tokens_per_s for r in rows], [r.id for r in rows], prior=calibrate.PRIOR,
                         weights=[1 / per_publication[r.publication] for r in rows])


@dataclass(frozen=True)
class HeldOutRow:
    """One row predicted by a fit on the other publications' rows."""

    id: str
    source: str
    model: str
    system: str
    nodes: int
    tp: int
    pp: int
    dp: int
    measured: float
    predicted: float
    publication: str = ""
    #: the held-out error quantiles of the other kinds (publications, systems or scale bands, as the row was
    #: held out): the interval this row is checked against
    others_low: float = 0.0
    others_high: float = 0.0
    #: GPUs of the whole run, the device's name, and the kind the row was held out with
    devices: int = 0
    device: str = ""
    kind: str = ""

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1

    @property
    def inside(self) -> bool:
        """Whether the measured value lies in the interval the other publications' errors give."""
        return self.others_low <= self.error <= self.others_high


def _interval(errors: list[float]) -> tuple[float, float]:
    """The split-conformal interval of `errors` (see above): the ceil((n + 1) · 0.95)-th smallest error and as
    many from the top. Up to 38 errors that is their whole range (k = 1), which holds 90% of new ones from 19
    errors on; below 19 no interval of them does, and the whole range is the widest they give."""
    if not errors:
        return 0.0, 0.0
    ordered = sorted(errors)
    rank = min(len(ordered), math.ceil((len(ordered) + 1) * (1 + COVERAGE) / 2))
    return ordered[len(ordered) - rank], ordered[rank - 1]


@dataclass(frozen=True)
class KindSummary:
    """How one held-out kind (a publication, a system, a scale band) was predicted by fits that never saw it."""

    held_out: str
    kind: str
    rows: int
    median_abs_error: float
    max_abs_error: float
    #: the share of its rows inside the interval the other kinds' errors give
    coverage: float
    #: the split-conformal interval of its own held-out errors: what a prediction of this kind carries
    interval: tuple[float, float]

    def to_dict(self) -> dict:
        return {"held_out": self.held_out, "kind": self.kind, "rows": self.rows,
                "median_abs_error": round(self.median_abs_error, 4), "max_abs_error": round(self.max_abs_error, 4),
                "coverage": round(self.coverage, 4), "interval": [round(v, 4) for v in self.interval]}


def summarise_kinds(way: str, checked: list[HeldOutRow]) -> list[KindSummary]:
    """Each kind of one way of holding out (`way`), in the order first seen."""
    out = []
    for name in dict.fromkeys(c.kind for c in checked):
        mine = [c for c in checked if c.kind == name]
        errors = [abs(c.error) for c in mine]
        out.append(KindSummary(way, name, len(mine), statistics.median(errors), max(errors),
                               sum(c.inside for c in mine) / len(mine), _interval([c.error for c in mine])))
    return out


@dataclass(frozen=True)
class Trust:
    """What every prediction carries: the corpus fit, the interval its errors give, the corpus's ranges."""

    efficiency: timing.Efficiency
    pinned: list[str]
    error_low: float  # held-out error quantiles (predicted/measured - 1)
    error_high: float
    ranges: Ranges
    checked: list[HeldOutRow]
    #: the rows as each way of holding out predicted them (HELD_OUT's ways; "publication" is `checked`)
    held_out: dict[str, list[HeldOutRow]] = field(default_factory=dict)
    #: carried intervals already worked out, by system, device, scale band and extrapolation: ranking asks
    #: for the same few thousands of times
    _carried: dict[tuple[str, str, str, bool], tuple[float, float]] = field(default_factory=dict, repr=False,
                                                                             compare=False)

    @property
    def median_abs_error(self) -> float:
        return statistics.median(abs(c.error) for c in self.checked)

    @property
    def max_abs_error(self) -> float:
        return max(abs(c.error) for c in self.checked)

    @property
    def coverage(self) -> float:
        """The share of held-out rows inside the interval the other publications' errors give them."""
        return sum(c.inside for c in self.checked) / len(self.checked)

    @property
    def mean_half_width(self) -> float:
        """The intervals' mean half-width, as a fraction of the prediction."""
        return statistics.mean((1 / (1 + c.others_low) - 1 / (1 + c.others_high)) / 2 for c in self.checked)

    @property
    def publications(self) -> int:
        return len({c.publication for c in self.checked})

    def kinds(self) -> dict[str, list[KindSummary]]:
        """Per way of holding out, each kind's held-out errors."""
        return {way: summarise_kinds(way, found) for way, found in self.held_out.items()}

    def error_interval(self, system: System | None = None, devices: int | None = None,
                       extrapolated: bool = False) -> tuple[float, float]:
        """The held-out error interval a prediction of `devices` GPUs on `system` carries (see the module's
        docstring); without a system, the publication-held-out interval alone."""
        if system is None or devices is None:
            return self.error_low, self.error_high
        key = (system.name, system.device_name, scale_band(devices), extrapolated)
        if key not in self._carried:
            self._carried[key] = carried(self.held_out, system.name, system.device_name, devices, extrapolated)
        return self._carried[key]

    def interval(self, tokens_per_s: float, system: System | None = None, devices: int | None = None,
                 extrapolated: bool = False) -> tuple[float, float]:
        """Where the measured tokens/s lies, from the predicted, if the model errs as it did on the held-out
        kinds the prediction belongs to."""
        low, high = self.error_interval(system, devices, extrapolated)
        return tokens_per_s / (1 + high), tokens_per_s / (1 + low)

    def carried_check(self) -> list[tuple[HeldOutRow, float, float]]:
        """Each row's publication-held-out error with the interval its kind would carry were its publication
        not in the corpus: how often the intervals predictions carry hold on a publication not seen."""
        out = []
        for c in self.checked:
            low, high = carried(self.held_out, c.system, c.device, c.devices, False, without=c.publication)
            out.append((c, low, high))
        return out


def carried(held_out: dict[str, list[HeldOutRow]], system: str, device: str, devices: int, extrapolated: bool,
            without: str = "") -> tuple[float, float]:
    """The widest of the publication-held-out interval, the scale band's and the system's (the profile's
    rows, else those of its device); where the band or the system has no row, or the prediction
    extrapolates, the widest any held-out kind gave. `without` leaves a publication's rows out."""
    def errors(way: str, keep: Callable[[HeldOutRow], bool] = lambda c: True) -> list[float]:
        return [c.error for c in held_out.get(way, []) if c.publication != without and keep(c)]

    band = scale_band(devices)
    scale = errors("scale", lambda c: c.kind == band)
    on_system = errors("system", lambda c: c.system == system) or errors("system", lambda c: c.device == device)
    found = [_interval(e) for e in (errors("publication"), scale, on_system) if e]
    if extrapolated or not scale or not on_system:
        found += [_interval(errors(way, lambda c, k=k: c.kind == k))
                  for way, rows in held_out.items() for k in dict.fromkeys(c.kind for c in rows)
                  if errors(way, lambda c, k=k: c.kind == k)]
    if not found:
        return 0.0, 0.0
    return min(f[0] for f in found), max(f[1] for f in found)


def _kind(row: CorpusRow, way: str) -> str:
    if way == "publication":
        return row.publication
    if way == "system":
        return row.planned.system.name
    return scale_band(row.candidate.layout.world)


def hold_out(rows: list[CorpusRow], way: str = "publication",
             progress: Callable[[int, int], None] | None = None) -> list[HeldOutRow]:
    """Each kind's rows (a publication's, a system's, a scale band's) predicted by a fit on the other kinds'
    rows, each checked against the interval the other kinds' held-out errors give. A scale band is fitted
    on the rows below it (a user extrapolates to more GPUs than were measured); the lowest on those above."""
    kinds = list(dict.fromkeys(_kind(r, way) for r in rows))
    if len(kinds) < 2:
        raise PlanError(f"the planner corpus needs rows of two {way}s at least to hold one out")
    predicted: list[tuple[CorpusRow, float]] = []
    for i, name in enumerate(kinds):
        if progress:
            progress(i, len(kinds))
        basis = [r for r in rows if _kind(r, way) != name and r.fitted]
        if way == "scale":
            below = [r for r in basis if r.candidate.layout.world < _band_floor(name)]
            basis = below or basis
        if not basis:
            raise PlanError(f"the planner corpus has no row that states every input outside {name}: nothing "
                            "to fit on while it is held out")
        fitted = fit_rows(basis)
        predicted += [(r, predict_row(r, fitted.efficiency)) for r in rows if _kind(r, way) == name]
    out = []
    for row, value in predicted:
        mine = _kind(row, way)
        others = [v / r.tokens_per_s - 1 for r, v in predicted if _kind(r, way) != mine]
        low, high = _interval(others)
        c = row.candidate
        out.append(HeldOutRow(row.id, row.source, row.planned.model.name, row.planned.system.name, c.layout.nodes,
                              c.layout.tp, c.layout.pp, c.layout.dp, row.tokens_per_s, value, row.publication, low,
                              high, c.layout.world, row.planned.system.device_name, mine))
    return out


def leave_one_source_out(rows: list[CorpusRow],
                         progress: Callable[[int, int], None] | None = None) -> list[HeldOutRow]:
    """Each publication's rows predicted by a fit on the others', each checked against the interval the
    others' held-out errors give."""
    return hold_out(rows, "publication", progress)


def _digest(path: Path) -> str:
    """The corpus, the system profiles its rows name and the code (the device table's measured rates
    included): a change to any would change the validation (every profile is read: cheaper than parsing the
    corpus to pick its few)."""
    h = hashlib.sha256(path.read_bytes())
    for module in (timing, memory, calibrate, candidate, corpus, flops, models, devices, systems, sys.modules[__name__]):
        h.update(Path(module.__file__).read_bytes())
    for profile in sorted(systems_dir().glob("*.yaml")):
        h.update(profile.name.encode() + b"\0" + profile.read_bytes())
    return h.hexdigest()[:16]


_MEMO: dict[str, Trust] = {}


def corpus_trust(results_dir: Path | None, progress: Callable[[int, int], None] | None = None,
          path: Path | None = None) -> Trust:
    """The planner's trust, from the cache when the corpus and the model are unchanged."""
    path = path or corpus_path()
    if not path.is_file():
        raise PlanError(f"the planner's validation corpus is missing: {path}")
    key = _digest(path)
    cache = Path(results_dir) / "plan" / _CACHE if results_dir is not None else None
    if key in _MEMO:
        if cache is not None and not cache.is_file():
            _store(cache, key, _MEMO[key])
        return _MEMO[key]
    rows = load_corpus(path)
    stored = _cached(cache)
    if stored.get("digest") == key:
        eff, pinned = timing.Efficiency(**stored["efficiency"]), stored["pinned"]
        held = {way: [HeldOutRow(**c) for c in found] for way, found in stored["held_out"].items()}
    else:
        whole = fit_rows([r for r in rows if r.fitted])
        eff, pinned = whole.efficiency, whole.pinned
        held = {way: hold_out(rows, way, progress) for way in HELD_OUT}
    low, high = _interval([c.error for c in held["publication"]])
    result = Trust(eff, pinned, low, high, ranges(rows), held["publication"], held)
    if cache is not None and stored.get("digest") != key:
        _store(cache, key, result)
    _MEMO[key] = result
    return result


def _cached(cache: Path | None) -> dict:
    """The kept validation, or {} where there is none or it cannot be read: it is only a cache."""
    try:
        found = json.loads(cache.read_text()) if cache is not None and cache.is_file() else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def _store(cache: Path, key: str, found: Trust) -> None:
    """Keep the validation where the results folder can hold it (a full or read-only one is no error)."""
    with contextlib.suppress(OSError):
        write_json_atomic(cache, {"digest": key, "efficiency": found.efficiency.to_dict(), "pinned": found.pinned,
                                  "held_out": {way: [asdict(c) for c in rows] for way, rows in found.held_out.items()}})
