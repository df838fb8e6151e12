"""Minimal scene edits that make a caption true: exact image negatives for the synthetic world.

`realize_caption(scene, text)` returns a copy of the scene, edited as little as the world's rules allow,
of which `text` holds (checked with `caption_holds`), or None. The search is deterministic (nothing is
re-rolled) and runs in three steps:

1. Identity. Every mention of every sentence of the caption's reading is assigned to a scene object:
   distinct objects within a sentence (as the truth checker requires), shared freely across sentences.
   An assignment pins field values (shape, colour, size, pattern) of objects; its cost is the weighted
   number of pinned values that differ from the scene. A best-first search over the sentences, with a
   forward check that every remaining sentence still has a conflict-free assignment, yields the
   assignments in increasing cost.
2. Repair. Object colours that would vanish into the background and identical twins are fixed by
   changing a field no mention pins (pattern, then colour, then shape; never size, which would move
   objects), first value in vocabulary order.
3. Layout. Regions ("in the top left corner"), relations ("left of"), the image border and non-overlap
   are satisfied by moving as few objects as possible: none, then one object to the nearest free grid
   point, then two (swapping places or to grid points), then permutations of the existing places.

Candidates are ranked by total cost (FIELD_COST per changed value, MOVE_COST per moved object,
BACKGROUND_COST for a changed background) and the cheapest one on which the caption holds, and the
optional `avoid` caption does not, is returned. Edits never add or remove objects: a caption that needs
more objects than the scene has, or claims another object count, is not realizable (None).
"""

from __future__ import annotations

import copy
import heapq
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import combinations, permutations
from typing import Any

import numpy as np

from compo.world.captions import ORIGINAL_STYLE, Caption, CaptionStyle, render_short, sample_short_plan, swap_values
from compo.world.scene import EDGE, GAP, POSITION_DECIMALS, RADIUS, RELATION_MARGIN, scene_relations
from compo.world.truth import Reading, caption_holds, read_caption
from compo.world.vocab import ATTRIBUTE_FIELDS, BACKGROUND_CLASHES, FIELD_VALUES

# A changed shape costs a little more than a changed attribute: the noun names the object, so a swap of
# two colours is realized by recolouring the two objects rather than by reshaping both.
FIELD_COST = {"colour": 2, "size": 2, "pattern": 2, "shape": 3}
MOVE_COST = 2
BACKGROUND_COST = 2
REPAIR_FIELDS = ("pattern", "colour", "shape")
MAX_EXPANSIONS = 5000  # search states popped per caption: bounds the time on pathological long captions
MAX_CANDIDATES = 32    # complete assignments laid out and verified per caption
FINE_STEP, COARSE_STEP = 0.02, 0.05  # grids for moving one object, and two objects at once
TWIN_ATTEMPTS = 20  # captions drawn per scene before it is left without a binding twin
_TOLERANCE = 5e-4  # sampled positions are rounded to POSITION_DECIMALS and may sit this far past a bound

Requirement = tuple[int, str, str]      # (object, field, value)
Relation = tuple[int, str, int]         # (subject object, relation, object object)


@dataclass(frozen=True)
class _Option:
    """One assignment of a sentence's mentions to distinct objects, and what it demands of them."""

    requirements: tuple[Requirement, ...]
    regions: tuple[tuple[int, str], ...]
    relations: tuple[Relation, ...]


def _sentence_options(reading: Reading, objects: list[dict[str, Any]], background: str
                      ) -> list[list[_Option]] | None:
    """Per sentence with mentions, every admissible assignment; None if some sentence has none."""
    clashes = BACKGROUND_CLASHES[background]
    out = []
    for sentence in reading.sentences:
        if not sentence.mentions:
            continue
        if any(len(values) != 1 for m in sentence.mentions for values in m.values.values()):
            return None  # "a red blue circle": no object has two colours
        options = []
        for assignment in permutations(range(len(objects)), len(sentence.mentions)):
            requirements = tuple(
                (obj, field, next(iter(values)))
                for mention, obj in zip(sentence.mentions, assignment, strict=True)
                for field, values in sorted(mention.values.items())
            )
            if any(field == "colour" and value in clashes for _, field, value in requirements):
                continue
            regions = tuple((obj, word) for mention, obj in zip(sentence.mentions, assignment, strict=True)
                            for word in mention.regions)
            relations = tuple((assignment[a], rel, assignment[b]) for a, rel, b in sentence.relations)
            options.append(_Option(requirements, regions, relations))
        if not options:
            return None  # more mentions than objects, or only colours the background would swallow
        out.append(options)
    return out


def _increment(option: _Option, pinned: dict[tuple[int, str], str], objects: list[dict[str, Any]]
               ) -> int | None:
    """Extra cost of adding the option's requirements to `pinned`; None on a conflict."""
    cost = 0
    for obj, field, value in option.requirements:
        have = pinned.get((obj, field))
        if have is None:
            if objects[obj][field] != value:
                cost += FIELD_COST[field]
        elif have != value:
            return None
    return cost


def _assignments(options: list[list[_Option]], objects: list[dict[str, Any]]
                 ) -> Iterator[tuple[int, dict[tuple[int, str], str], list[_Option]]]:
    """Complete assignments (cost, pinned values, chosen options) in nondecreasing cost (A* search).

    The heuristic, the largest cheapest increment over the remaining sentences, never overestimates:
    the cost of a set of pinned values only grows as values are added."""
    order = sorted(range(len(options)), key=lambda s: (len(options[s]), s))  # most constrained first
    levels = [options[s] for s in order]
    # entries: (cost + bound, cost, tie-break counter, level, pinned values, chosen option per level)
    heap: list[tuple[int, int, int, int, dict[tuple[int, str], str], tuple[int, ...]]] = [
        (0, 0, 0, 0, {}, ())]
    counter = 0
    for _ in range(MAX_EXPANSIONS):
        if not heap:
            return
        _, g, _, level, pinned, chosen = heapq.heappop(heap)
        if level == len(levels):
            yield g, pinned, [levels[i][c] for i, c in enumerate(chosen)]
            continue
        for index, option in enumerate(levels[level]):
            step = _increment(option, pinned, objects)
            if step is None:
                continue
            child = dict(pinned)
            child.update({(obj, field): value for obj, field, value in option.requirements})
            bound = 0
            for rest in levels[level + 1:]:
                steps = [s for s in (_increment(o, child, objects) for o in rest) if s is not None]
                if not steps:
                    break
                bound = max(bound, min(steps))
            else:
                counter += 1
                entry = (g + step + bound, g + step, counter, level + 1, child, (*chosen, index))
                heapq.heappush(heap, entry)


def _key(obj: dict[str, Any]) -> tuple[str, ...]:
    return obj["shape"], obj["colour"], obj["size"], obj["pattern"]


def _repair(objects: list[dict[str, Any]], pinned: dict[tuple[int, str], str], background: str) -> int | None:
    """Fix clashing colours and identical twins in place by changing unpinned fields; the cost, or None."""
    clashes = BACKGROUND_CLASHES[background]
    cost = 0
    for _ in range(2 * len(objects)):
        broken = [i for i, o in enumerate(objects) if o["colour"] in clashes]
        if not broken:
            keys = [_key(o) for o in objects]
            broken = [j for j in range(len(objects)) if keys[j] in keys[:j]]
        if not broken:
            return cost
        i = broken[0]
        fields = ("colour",) if objects[i]["colour"] in clashes else REPAIR_FIELDS
        others = {_key(o) for j, o in enumerate(objects) if j != i}
        fixed = False
        for field in fields:
            if (i, field) in pinned:
                continue
            for value in FIELD_VALUES[field]:
                trial = {**objects[i], field: value}
                usable = trial["colour"] not in clashes and _key(trial) not in others
                if value != objects[i][field] and usable:
                    objects[i][field] = value
                    cost += FIELD_COST[field]
                    fixed = True
                    break
            if fixed:
                break
        if not fixed:
            return None
    return None


def _grid(step: float) -> tuple[np.ndarray, np.ndarray]:
    ticks = np.round(np.arange(step, 1.0, step), POSITION_DECIMALS)
    xs, ys = np.meshgrid(ticks, ticks)
    return xs.ravel(), ys.ravel()


_FINE, _COARSE = _grid(FINE_STEP), _grid(COARSE_STEP)


def _thirds(v: np.ndarray) -> np.ndarray:
    return np.where(v < 1 / 3, 0, np.where(v > 2 / 3, 2, 1))


class _Layout:
    """Positions satisfying the border, non-overlap, region and relation constraints of one candidate."""

    def __init__(self, objects: list[dict[str, Any]], regions: set[tuple[int, str]],
                 relations: set[Relation]):
        self.n = len(objects)
        self.radius = [RADIUS[o["size"]] for o in objects]
        self.home = [(float(o["x"]), float(o["y"])) for o in objects]
        self.regions = regions
        self.relations = relations
        self._sorted: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def feasible(self, i: int, xs: np.ndarray, ys: np.ndarray, placed: dict[int, tuple[float, float]]
                 ) -> np.ndarray:
        """Which candidate positions (xs, ys) of object i are compatible with the `placed` objects."""
        low, high = self.radius[i] + EDGE - _TOLERANCE, 1 - self.radius[i] - EDGE + _TOLERANCE
        ok = (xs >= low) & (xs <= high) & (ys >= low) & (ys <= high)
        for j, (x, y) in placed.items():
            ok &= (xs - x) ** 2 + (ys - y) ** 2 >= (self.radius[i] + self.radius[j] + GAP) ** 2
        words = [word for obj, word in self.regions if obj == i]
        rows, cols = (_thirds(ys), _thirds(xs)) if words else (ys, xs)
        for word in words:
            if word in ("top", "upper"):
                ok &= rows == 0
            elif word in ("bottom", "lower"):
                ok &= rows == 2
            elif word == "left":
                ok &= cols == 0
            elif word == "right":
                ok &= cols == 2
            else:  # centre: the middle third on both axes
                ok &= (rows == 1) & (cols == 1)
        for a, rel, b in self.relations:
            if a == i and b in placed:  # the candidate is the subject: "i is left of b"
                bx, by = placed[b]
                ok &= {"left of": bx - xs, "right of": xs - bx, "above": by - ys, "below": ys - by}[rel] \
                    > RELATION_MARGIN
            elif b == i and a in placed:
                ax, ay = placed[a]
                ok &= {"left of": xs - ax, "right of": ax - xs, "above": ys - ay, "below": ay - ys}[rel] \
                    > RELATION_MARGIN
        return ok

    def _consistent(self, placed: dict[int, tuple[float, float]]) -> bool:
        """Whether already placed objects satisfy every constraint among themselves."""
        done: dict[int, tuple[float, float]] = {}
        for i, (x, y) in placed.items():
            if not self.feasible(i, np.array([x]), np.array([y]), done)[0]:
                return False
            done[i] = (x, y)
        return True

    def _ordered(self, i: int, xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = (i, len(xs))
        if key not in self._sorted:
            hx, hy = self.home[i]
            order = np.lexsort((xs, ys, (xs - hx) ** 2 + (ys - hy) ** 2))  # nearest first, ties by y then x
            self._sorted[key] = xs[order], ys[order]
        return self._sorted[key]

    def solve(self) -> tuple[list[tuple[float, float]], int] | None:
        """Positions for every object and the number of objects moved, moving as few as possible."""
        for k in range(self.n + 1):
            best: tuple[float, dict[int, tuple[float, float]]] | None = None
            for moved in combinations(range(self.n), k):
                fixed = {i: self.home[i] for i in range(self.n) if i not in moved}
                if not self._consistent(fixed):
                    continue
                found = self._place(list(moved), fixed)
                if found is not None:
                    shift = sum(np.hypot(found[i][0] - self.home[i][0], found[i][1] - self.home[i][1])
                                for i in moved)
                    if best is None or shift < best[0] - 1e-12:
                        best = (shift, found)
            if best is not None:
                return [best[1][i] for i in range(self.n)], k
        return None

    def _place(self, moved: list[int], fixed: dict[int, tuple[float, float]]
               ) -> dict[int, tuple[float, float]] | None:
        if not moved:
            return fixed
        if len(moved) >= 3:  # only permutations of the existing places
            for places in permutations([self.home[i] for i in moved]):
                if any(p == self.home[i] for i, p in zip(moved, places, strict=True)):
                    continue
                trial = {**fixed, **dict(zip(moved, places, strict=True))}
                if self._consistent(trial):
                    return trial
            return None
        first, rest = moved[0], moved[1:]
        if not rest:
            xs, ys = self._ordered(first, *_FINE)
            hits = np.flatnonzero(self.feasible(first, xs, ys, fixed) & ~((xs == self.home[first][0])
                                                                            & (ys == self.home[first][1])))
            return {**fixed, first: (float(xs[hits[0]]), float(ys[hits[0]]))} if hits.size else None
        second = rest[0]
        # `first` visits the other's place (a swap) and then the grid; `second` likewise, nearest first
        xs, ys = self._candidates(first, second)
        ox, oy = self._candidates(second, first)
        for at in np.flatnonzero(self.feasible(first, xs, ys, fixed)):
            placed = {**fixed, first: (float(xs[at]), float(ys[at]))}
            hits = np.flatnonzero(self.feasible(second, ox, oy, placed))
            if hits.size:
                return {**placed, second: (float(ox[hits[0]]), float(oy[hits[0]]))}
        return None

    def _candidates(self, i: int, other: int) -> tuple[np.ndarray, np.ndarray]:
        """Places object i may move to when it moves with `other`: other's place, then the coarse grid;
        never its own place (that would be moving one object, already tried)."""
        xs, ys = self._ordered(i, *_COARSE)
        xs, ys = np.concatenate([[self.home[other][0]], xs]), np.concatenate([[self.home[other][1]], ys])
        keep = ~((xs == self.home[i][0]) & (ys == self.home[i][1]))
        return xs[keep], ys[keep]


def realize_caption(scene: dict[str, Any], text: str, avoid: str | None = None) -> dict[str, Any] | None:
    """A minimally edited copy of `scene` of which `text` holds, or None if no edit within the world's
    rules makes it hold. With `avoid`, the edit must also leave that caption not holding (an image
    negative must falsify its anchor's caption). Deterministic: the same inputs give the same scene."""
    reading = read_caption(text)
    if reading is None or len(reading.backgrounds) > 1:
        return None
    objects = scene["objects"]
    if any(n != len(objects) for n in reading.counts):
        return None  # edits never add or remove objects
    background = next(iter(reading.backgrounds), scene["background"])
    background_cost = BACKGROUND_COST if background != scene["background"] else 0
    options = _sentence_options(reading, objects, background)
    if options is None:
        return None

    best: tuple[int, dict[str, Any]] | None = None
    seen: set[tuple[frozenset[Any], ...]] = set()
    evaluated = 0
    for cost, pinned, chosen in _assignments(options, objects):
        if best is not None and cost + background_cost >= best[0]:
            break
        regions = {r for o in chosen for r in o.regions}
        relations = {r for o in chosen for r in o.relations}
        signature = (frozenset(pinned.items()), frozenset(regions), frozenset(relations))
        if signature in seen:
            continue
        seen.add(signature)
        evaluated += 1
        if evaluated > MAX_CANDIDATES:
            break
        edited = [dict(o) for o in objects]
        for (obj, field), value in pinned.items():
            edited[obj][field] = value
        repair = _repair(edited, pinned, background)
        if repair is None:
            continue
        layout = _Layout(edited, regions, relations).solve()
        if layout is None:
            continue
        places, moved = layout
        total = cost + background_cost + repair + MOVE_COST * moved
        if best is not None and total >= best[0]:
            continue
        for obj, (x, y) in zip(edited, places, strict=True):
            obj["x"], obj["y"] = round(x, POSITION_DECIMALS), round(y, POSITION_DECIMALS)
        candidate = copy.deepcopy(scene)
        candidate.update(background=background, objects=edited, relations=scene_relations(edited))
        avoided = avoid is None or caption_holds(candidate, avoid) is not True
        if avoided and caption_holds(candidate, text) is True:
            best = (total, candidate)
    return None if best is None else best[1]


def binding_twin(rng: np.random.Generator, scene: dict[str, Any], ungrounded_rate: float,
                 attempts: int = TWIN_ATTEMPTS, style: CaptionStyle = ORIGINAL_STYLE
                 ) -> tuple[Caption, Caption, dict[str, Any]] | None:
    """A scene's binding twin, SugarCrepe swap-att's pair with an image on each side: a short caption of
    `scene` that states one attribute of two objects, the caption with those values exchanged (the same
    words, bound otherwise; false of `scene`), and the scene minimally re-rendered so that the exchanged
    caption holds and the first does not (`realize_caption`). None when `attempts` drawn captions give no
    such pair (a scene of one object, or whose objects share every stated value)."""
    for _ in range(attempts):
        plan = sample_short_plan(rng, scene, ungrounded_rate, style)
        swapped = swap_values(plan, rng, ATTRIBUTE_FIELDS)
        if swapped is None:
            continue
        caption, twin_caption = render_short(plan), render_short(swapped)
        if caption_holds(scene, caption.text) is not True or caption_holds(scene, twin_caption.text) is not False:
            continue
        twin = realize_caption(scene, twin_caption.text, avoid=caption.text)
        if twin is not None:
            return caption, twin_caption, twin
    return None
