"""Evaluate layouts: prune what cannot run or fit, predict the rest, rank by tokens/s."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, replace

from nlp_bench import flops
from nlp_bench.plan import memory, timing
from nlp_bench.plan.candidate import Candidate
from nlp_bench.plan.validation import Trust
from nlp_bench.spec.layout import data_parallel_size, expert_violations, replica_problem
from nlp_bench.spec.models import ModelSpec, pad_vocab
from nlp_bench.spec.switches import RECOMPUTE
from nlp_bench.spec.systems import System

#: why a layout with pipeline parallelism on an xla system is predicted but not offered
XLA_PIPELINE = ("the built-in trainer has no pipeline parallelism on xla (NxD Training has; the prediction "
                "stands for it)")


@dataclass(frozen=True)
class Prediction:
    candidate: Candidate
    memory_gib: float | None
    fits: bool
    tokens_per_s: float | None
    reason: str  # why it was pruned; "" when it runs
    tokens_per_s_low: float | None = None  # where the measured value lies if the model errs as on the corpus
    tokens_per_s_high: float | None = None
    outside: tuple[str, ...] = ()  # what lies outside the validation corpus's ranges

    @property
    def extrapolated(self) -> bool:
        return bool(self.outside)

    @property
    def time_to_report_s(self) -> float | None:
        return flops.time_to_report(self.tokens_per_s) if self.tokens_per_s else None

    def to_dict(self) -> dict:
        c = self.candidate

        def rounded(value: float | None, digits: int = 1) -> float | None:
            return None if value is None else round(value, digits)

        lay, on = c.layout, c.switches
        experts = {"ep": lay.ep, "etp": lay.expert_tp, "edp": lay.edp} if lay.ep > 1 or lay.etp is not None else {}
        return {"nodes": lay.nodes, "tp": lay.tp, "pp": lay.pp, "cp": lay.cp, "dp": lay.dp, "vp": lay.vp, "mbs": lay.mbs,
                **experts,
                "gas": lay.gas, "global_batch_size": lay.global_batch_size, "recompute": on.recompute,
                "distributed_optimizer": on.distributed_optimizer, "sequence_parallel": on.sequence_parallel,
                "memory_gib": rounded(self.memory_gib, 2), "fits": self.fits,
                "tokens_per_s": rounded(self.tokens_per_s), "tokens_per_s_low": rounded(self.tokens_per_s_low),
                "tokens_per_s_high": rounded(self.tokens_per_s_high),
                "time_to_report_s": rounded(self.time_to_report_s, 2), "extrapolated": self.extrapolated,
                "outside_corpus": list(self.outside), "reason": self.reason}


def predict(model: ModelSpec, system: System, c: Candidate, eff: timing.Efficiency,
            trust: Trust | None = None) -> Prediction:
    """Memory, fit and tokens/s of one layout; with `trust`, the interval and whether it extrapolates. A
    layout the built-in trainer cannot run on xla (pipeline parallelism, which NxD Training has) is still
    predicted, and marked as not runnable here."""
    problems = c.problems(model)
    if problems:
        return Prediction(c, None, False, None, "; ".join(problems))
    vocab = pad_vocab(model.vocab_size, c.layout.tp)
    gib = memory.footprint(model, vocab, c).gib
    tokens = c.layout.global_batch_size * model.seq_length / timing.estimate(model, vocab, c, system, eff).iteration_s
    low = high = None
    outside: tuple[str, ...] = ()
    if trust is not None:
        outside = tuple(trust.ranges.outside(model, system, c, vocab))
        low, high = trust.interval(tokens, system, c.layout.world, bool(outside))
    reason = ""
    if system.device_memory_gib is not None and gib > system.device_memory_gib:
        reason = f"needs {gib:.1f} GiB per device, {system.device_memory_gib:g} GiB available"
    elif system.backend == "xla" and c.layout.pp > 1:
        reason = XLA_PIPELINE
    return Prediction(c, gib, not reason, tokens, reason, low, high, outside)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if 1 << k <= limit]


@dataclass(frozen=True)
class Space:
    """The axes to enumerate; None means every sensible value."""

    nodes: tuple[int, ...]
    tp: tuple[int, ...] | None = None
    pp: tuple[int, ...] | None = None
    vp: tuple[int, ...] | None = None
    mbs: tuple[int, ...] | None = None
    gas: tuple[int, ...] | None = None
    recompute: tuple[str, ...] = RECOMPUTE
    distributed_optimizer: tuple[bool, ...] = (True, False)
    global_batch_size: int | None = None  # kept fixed (gas follows) unless gas is pinned
    #: an MoE model's expert parallelism and expert tp (None: powers of two that divide the experts and tile
    #: each stage, and expert tp 1 or tp); a dense model keeps the base's
    ep: tuple[int, ...] | None = None
    etp: tuple[int, ...] | None = None


def _expert_axes(model: ModelSpec, space: Space, base: Candidate, world: int, tp: int, pp: int) -> list[tuple]:
    """The (ep, expert tp) pairs to try with tp and pp: those spec.layout's rules (ep-world, ep-experts)
    let run. Expert tp defaults to 1 and tp (Megatron-core's guideline: ep over expert tp, whose GEMMs are
    narrower); a dense model has the base's."""
    if model.moe is None:
        return [(base.layout.ep, base.layout.etp)]
    eps = space.ep or _powers_of_two(min(model.moe.num_experts, world))
    etps = space.etp or tuple(dict.fromkeys((1, tp)))
    return [(ep, etp) for ep, etp in itertools.product(eps, etps)
            if not expert_violations(world, etp, ep, pp, model.moe.num_experts)]


def _pipeline_sizes(model: ModelSpec, base: Candidate, world: int) -> list[int]:
    """The pipeline sizes to try: those that divide the layers, or with the base's uneven first/last stages
    (DeepSeek-V3's 61 layers), those whose other stages split the rest evenly."""
    given = [n for n in (base.layout.first_stage_layers, base.layout.last_stage_layers) if n is not None]
    rest = model.num_layers - sum(given)
    if not given:
        return [p for p in range(1, min(model.num_layers, world) + 1) if model.num_layers % p == 0]
    return [p for p in range(2, min(model.num_layers, world) + 1)
            if (p - len(given) == 0 and rest == 0) or (p > len(given) and rest % (p - len(given)) == 0)]


def _sizes(model: ModelSpec, system: System, space: Space, base: Candidate) -> Iterable[tuple]:
    """(nodes, tp, pp, mbs, gradient-accumulation steps to try, why none) of every size combination of the
    space; `why` is (the rule, what it says in the user's words) where a combination has no layout."""
    dpn = system.devices_per_node
    for nodes in space.nodes:
        world = nodes * dpn
        tps = space.tp or [t for t in _powers_of_two(min(world, 4 * dpn)) if model.num_attention_heads % t == 0]
        pps = space.pp or ([1] if system.backend == "xla" else _pipeline_sizes(model, base, world))
        for tp, pp in itertools.product(tps, pps):
            problem = replica_problem(nodes, dpn, tp, pp, base.layout.cp)
            if problem:
                yield nodes, tp, pp, None, (), problem
                continue
            dp = data_parallel_size(world, tp, pp, base.layout.cp)
            for mbs in space.mbs or (1, 2, 4, 8):
                gbs = space.global_batch_size or base.layout.global_batch_size
                if not space.gas and gbs % (dp * mbs):
                    yield nodes, tp, pp, mbs, (), ("batch", f"the global batch {gbs} is no multiple of dp {dp} x mbs "
                                                            f"{mbs} (tp {tp} x pp {pp} on {nodes} node(s)); pin --gas "
                                                            "to let the batch follow, or give --global-batch-size")
                    continue
                yield nodes, tp, pp, mbs, space.gas or (gbs // (dp * mbs),), None


def candidates(model: ModelSpec, system: System, space: Space, base: Candidate) -> Iterable[Candidate]:
    """Every layout of the space, with the base's precision, sequence parallelism and attention."""
    dpn = system.devices_per_node
    for nodes, tp, pp, mbs, gases, why in _sizes(model, system, space, base):
        if why:
            continue
        uneven = base.layout.first_stage_layers is not None or base.layout.last_stage_layers is not None
        vps = space.vp or [v for v in (1, 2, 3, 4, 6, 8) if (pp > 1 and not uneven) or v == 1]
        dp = data_parallel_size(nodes * dpn, tp, pp, base.layout.cp)
        experts = _expert_axes(model, space, base, nodes * dpn, tp, pp)
        for gas, vp, rc, do, (ep, etp) in itertools.product(gases, vps, space.recompute, space.distributed_optimizer,
                                                            experts):
            yield Candidate(replace(base.layout, nodes=nodes, devices_per_node=dpn, tp=tp, pp=pp, mbs=mbs, gas=gas, vp=vp,
                                    ep=ep, etp=etp),
                            replace(base.switches, recompute=rc, distributed_optimizer=do and dp > 1))


def unreachable(model: ModelSpec, system: System, space: Space, base: Candidate, shown: int = 3) -> str:
    """Why the space holds no layout at all: how many size combinations each rule leaves out, with an
    example of each."""
    by_rule: dict[str, list[str]] = {}
    for *_, why in _sizes(model, system, space, base):
        if why:
            by_rule.setdefault(why[0], []).append(why[1])
    if not by_rule:
        return "the space is empty"
    ranked = sorted(by_rule.values(), key=len, reverse=True)
    return "; ".join(f"{len(whys)} combination(s) like this: {whys[0]}" for whys in ranked[:shown])


def rank(model: ModelSpec, system: System, space: Space, base: Candidate, eff: timing.Efficiency,
         trust: Trust | None = None) -> tuple[list[Prediction], list[Prediction]]:
    """(runnable layouts fastest first, pruned layouts most promising first); duplicates dropped."""
    seen: set[Candidate] = set()
    good, pruned = [], []
    for c in candidates(model, system, space, base):
        if c in seen:
            continue
        seen.add(c)
        p = predict(model, system, c, eff, trust)
        (good if p.fits else pruned).append(p)
    good.sort(key=lambda p: -p.tokens_per_s)
    pruned.sort(key=lambda p: -(p.tokens_per_s or 0.0))
    return good, pruned


def smallest_nodes(model: ModelSpec, system: System, space: Space, base: Candidate, eff: timing.Efficiency,
                   target_s: float, limit: int | None = None,
                   trust: Trust | None = None) -> Prediction | None:
    """The best layout on the fewest nodes whose predicted time_to_report meets the target (every node
    count from 1 up to the system's size is tried), or None."""
    for nodes in range(1, (limit or system.max_nodes or 4096) + 1):
        good, _ = rank(model, system, replace(space, nodes=(nodes,)), base, eff, trust)
        if good and good[0].time_to_report_s <= target_s:
            return good[0]
    return None
